// Error checks for GoogleTest: attnkit rejects bad input with std::invalid_argument whose message
// names the argument (docs/design.md "Errors").
//
//   expect_invalid(f, needle)   f() must throw std::invalid_argument whose what() contains needle;
//                               no exception, or another type, is a test failure
//
//   expect_invalid([&] { attnkit::static_qk_attention(qf, kf, v, out); }, "q_fixed: expected batch 1");
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <stdexcept>
#include <string>

namespace attnkit_test {

template <class F>
void expect_invalid(F&& f, const std::string& needle) {
    try {
        f();
        ADD_FAILURE() << "no exception; expected std::invalid_argument mentioning \"" << needle << "\"";
    } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    } catch (const std::exception& e) {
        ADD_FAILURE() << "wrong exception type (expected std::invalid_argument mentioning \"" << needle
                      << "\"): " << e.what();
    }
}

}  // namespace attnkit_test
