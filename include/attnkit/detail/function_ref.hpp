// A non-owning reference to a callable, for the kernels' per-row callbacks.
//
// The drivers hand each kernel a callback that receives a finished row (its Dv outputs and
// summary). Passed as a template parameter, every distinct lambda of a driver instantiated the
// whole kernel again: the forward driver's four callbacks made four copies of the row and tile
// kernels per policy and storage type, which dominated compile time and code size. Through a
// function_ref the kernel is instantiated once; the indirect call happens once per finished row,
// against a walk over all of that row's keys.
#pragma once

#include <memory>
#include <type_traits>
#include <utility>

namespace attnkit {
namespace detail {

template <class Signature>
class function_ref;

template <class R, class... Args>
class function_ref<R(Args...)> {
   public:
    template <class F, class = std::enable_if_t<!std::is_same<std::decay_t<F>, function_ref>::value &&
                                                std::is_invocable_r<R, F&, Args...>::value>>
    function_ref(F&& f) noexcept  // NOLINT(google-explicit-constructor): used like a callable
        : obj_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
          call_([](void* obj, Args... args) -> R {
              return (*static_cast<std::remove_reference_t<F>*>(obj))(std::forward<Args>(args)...);
          }) {}

    R operator()(Args... args) const { return call_(obj_, std::forward<Args>(args)...); }

   private:
    void* obj_;
    R (*call_)(void*, Args...);
};

}  // namespace detail
}  // namespace attnkit
