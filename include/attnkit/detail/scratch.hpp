// Scratch buffers for the kernels, kept per thread across calls.
//
// A tile kernel's buffers are a few hundred KiB: allocated per work item they would come from
// mmap and be faulted in and zeroed each time, which costs a few percent and serialises threads
// on the address-space lock. Allocated per call they make a decode step's time depend on the
// allocator: glibc serves a block above its mmap threshold from fresh pages, and the threshold
// moves with the process's history, so the same decode step could take several times as long.
// So each thread keeps its buffers: a lease takes the next one from the calling thread's stack
// and gives it back when it ends, and a buffer keeps its capacity. After a thread's first call of
// a shape, the kernels' scratch allocates nothing. Leases are scoped objects, so they end in
// the reverse order of their start on each thread, which is what the stack needs; a buffer may
// be read and written by other threads while its lease lasts (a call's split-KV partials).
// What a thread keeps is the largest scratch of each depth it has used, freed when it exits.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

namespace attnkit {
namespace detail {

template <class T>
class scratch_stack {
   public:
    std::vector<T>* push() {
        if (used_ == all_.size()) all_.push_back(std::make_unique<std::vector<T>>());
        return all_[used_++].get();
    }
    void pop() noexcept { --used_; }

    static scratch_stack& of_this_thread() {
        thread_local scratch_stack s;
        return s;
    }

   private:
    std::vector<std::unique_ptr<std::vector<T>>> all_;
    std::size_t used_ = 0;
};

// A buffer of this thread's for the lifetime of the lease (any contents: callers size and fill it).
template <class T = float>
class scratch_lease {
   public:
    scratch_lease() : stack_(scratch_stack<T>::of_this_thread()), buf_(stack_.push()) {}
    ~scratch_lease() { stack_.pop(); }
    scratch_lease(const scratch_lease&) = delete;
    scratch_lease& operator=(const scratch_lease&) = delete;
    std::vector<T>& get() noexcept { return *buf_; }

   private:
    scratch_stack<T>& stack_;
    std::vector<T>* buf_;
};

// An object of this thread's for the lifetime of the lease, kept across calls: a struct of
// buffers (default-constructible) whose members keep their capacity, so sizing them again for
// a call of the same or a smaller shape allocates nothing.
template <class T>
class scratch_object {
   public:
    scratch_object() {
        if (lease_.get().empty()) lease_.get().emplace_back();
    }
    T& get() noexcept { return lease_.get().front(); }

   private:
    scratch_lease<T> lease_;
};

}  // namespace detail
}  // namespace attnkit
