# Work around Debian's xsimd 8.1 package: its imported target `xsimd` carries
# INTERFACE_LINK_LIBRARIES "xtl", a bare name that turns into -lxtl (a link error) when no
# CMake target called xtl exists. xtl is header-only and xsimd needs it only for optional
# xtl::xcomplex support, so when xtl cannot be found the item is dropped.
#
# Included by attnkit's CMakeLists.txt and by the installed attnkitConfig.cmake, after
# find_package(xsimd). Safe to include more than once.
if(TARGET xsimd)
    get_target_property(_attnkit_xsimd_links xsimd INTERFACE_LINK_LIBRARIES)
    if(_attnkit_xsimd_links AND "xtl" IN_LIST _attnkit_xsimd_links)
        if(NOT TARGET xtl)
            find_package(xtl QUIET)
        endif()
        if(NOT TARGET xtl)
            list(REMOVE_ITEM _attnkit_xsimd_links xtl)
            set_property(TARGET xsimd PROPERTY INTERFACE_LINK_LIBRARIES "${_attnkit_xsimd_links}")
        endif()
    endif()
    unset(_attnkit_xsimd_links)
endif()
