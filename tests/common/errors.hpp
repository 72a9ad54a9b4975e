// Error checks for GoogleTest: attnkit rejects bad input with std::invalid_argument whose message
// names the argument (docs/design.md "Errors").
//
//   expect_invalid(f, needle)   f() must throw std::invalid_argument whose what() contains needle;
//                               no exception, or another type, is a test failure
//   expect_invalid(f, {a, b})   ... whose what() contains every one of a, b, ...
//
//   expect_invalid([&] { attnkit::static_qk_attention(qf, kf, v, out); }, "q_fixed: expected batch 1");
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <utility>

namespace attnkit_test {

template <class F>
void expect_invalid(F&& f, std::initializer_list<std::string> needles) {
    const std::string first = needles.size() ? *needles.begin() : std::string();
    try {
        f();
        ADD_FAILURE() << "no exception; expected std::invalid_argument mentioning \"" << first << "\"";
    } catch (const std::invalid_argument& e) {
        const std::string what = e.what();
        for (const std::string& n : needles) EXPECT_NE(what.find(n), std::string::npos) << "'" << n << "' not in: " << what;
    } catch (const std::exception& e) {
        ADD_FAILURE() << "wrong exception type (expected std::invalid_argument mentioning \"" << first
                      << "\"): " << e.what();
    }
}

template <class F>
void expect_invalid(F&& f, const std::string& needle) {
    expect_invalid(std::forward<F>(f), std::initializer_list<std::string>{needle});
}

}  // namespace attnkit_test
