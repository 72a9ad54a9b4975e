// Scratch buffers reused across the work items of one call. A tile kernel's buffers are a few
// hundred KiB: allocated per item they would come from mmap and be faulted in and zeroed by the
// kernel each time, which costs a few percent and serialises threads on the address-space lock.
// At most one buffer per concurrently running item is ever created.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

namespace attnkit {
namespace detail {

class scratch_slots {
   public:
    std::vector<float>* acquire() {
        std::lock_guard<std::mutex> lock(mu_);
        if (free_.empty()) {
            all_.push_back(std::make_unique<std::vector<float>>());
            return all_.back().get();
        }
        std::vector<float>* b = free_.back();
        free_.pop_back();
        return b;
    }
    void release(std::vector<float>* b) {
        std::lock_guard<std::mutex> lock(mu_);
        free_.push_back(b);
    }

   private:
    std::mutex mu_;
    std::vector<std::unique_ptr<std::vector<float>>> all_;
    std::vector<std::vector<float>*> free_;
};

// A buffer held for the lifetime of one work item.
class scratch_lease {
   public:
    explicit scratch_lease(scratch_slots& s) : slots_(s), buf_(s.acquire()) {}
    ~scratch_lease() { slots_.release(buf_); }
    scratch_lease(const scratch_lease&) = delete;
    scratch_lease& operator=(const scratch_lease&) = delete;
    std::vector<float>& get() { return *buf_; }

   private:
    scratch_slots& slots_;
    std::vector<float>* buf_;
};

}  // namespace detail
}  // namespace attnkit
