// The MPI the ring needs, in one place: collective validation (every rank throws the same error
// or none does), byte transfers of any size, and an all-gather.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "attnkit/config.hpp"

namespace attnkit {
namespace distributed {
namespace detail {

// MPI's counts are int: larger transfers go in pieces of this many bytes.
constexpr std::int64_t kMaxMessageBytes = std::int64_t{1} << 30;

inline void check_mpi(int rc, const char* call) {
    if (rc != MPI_SUCCESS) {
        char text[MPI_MAX_ERROR_STRING];
        int n = 0;
        MPI_Error_string(rc, text, &n);
        throw std::runtime_error(std::string("attnkit::distributed: ") + call + " failed: " + std::string(text, n));
    }
}

struct comm_info {
    MPI_Comm comm;
    int rank = 0, size = 1;
    explicit comm_info(MPI_Comm c) : comm(c) {
        check_mpi(MPI_Comm_rank(c, &rank), "MPI_Comm_rank");
        check_mpi(MPI_Comm_size(c, &size), "MPI_Comm_size");
    }
};

// Runs check() on every rank, then agrees: if it threw std::invalid_argument on any rank, every
// rank throws the message of the lowest such rank, prefixed with that rank, so that no rank goes
// on into a transfer that its peers will never join (which would hang). Collective.
template <class Check>
void agree(const comm_info& c, const char* entry, Check&& check) {
    std::string message;
    int failed = c.size;
    try {
        check();
    } catch (const std::invalid_argument& e) {
        message = e.what();
        const std::string prefix = "attnkit: ";  // detail::fail's, replaced by the entry point's
        if (message.compare(0, prefix.size(), prefix) == 0) message.erase(0, prefix.size());
        failed = c.rank;
    }
    int first = c.size;
    check_mpi(MPI_Allreduce(&failed, &first, 1, MPI_INT, MPI_MIN, c.comm), "MPI_Allreduce");
    if (first == c.size) return;
    int n = static_cast<int>(message.size());
    check_mpi(MPI_Bcast(&n, 1, MPI_INT, first, c.comm), "MPI_Bcast");
    message.resize(static_cast<std::size_t>(n));
    check_mpi(MPI_Bcast(&message[0], n, MPI_CHAR, first, c.comm), "MPI_Bcast");
    throw std::invalid_argument(std::string(entry) + ": rank " + std::to_string(first) + ": " + message);
}

// Every rank's `n` values, rank by rank.
inline std::vector<std::int64_t> all_gather(const comm_info& c, const std::vector<std::int64_t>& mine) {
    std::vector<std::int64_t> all(mine.size() * static_cast<std::size_t>(c.size));
    check_mpi(MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_INT64_T, all.data(),
                            static_cast<int>(mine.size()), MPI_INT64_T, c.comm),
              "MPI_Allgather");
    return all;
}

// Non-blocking transfers of byte ranges of any size (split at kMaxMessageBytes), completed
// together by wait().
class transfers {
   public:
    explicit transfers(MPI_Comm comm) : comm_(comm) {}
    transfers(const transfers&) = delete;
    transfers& operator=(const transfers&) = delete;
    ~transfers() {
        // Only reached with requests pending when an exception unwinds; finish them so that no
        // buffer is freed under MPI.
        if (!requests_.empty())
            MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE);
    }

    // Both sides compute the same byte count; an empty transfer posts nothing.
    void send(const void* data, std::int64_t bytes, int to, int tag) {
        const char* p = static_cast<const char*>(data);
        for (std::int64_t at = 0; at < bytes;) {
            const int n = static_cast<int>(std::min(bytes - at, kMaxMessageBytes));
            requests_.emplace_back();
            check_mpi(MPI_Isend(p + at, n, MPI_BYTE, to, tag, comm_, &requests_.back()), "MPI_Isend");
            at += n;
        }
    }
    void receive(void* data, std::int64_t bytes, int from, int tag) {
        char* p = static_cast<char*>(data);
        for (std::int64_t at = 0; at < bytes;) {
            const int n = static_cast<int>(std::min(bytes - at, kMaxMessageBytes));
            requests_.emplace_back();
            check_mpi(MPI_Irecv(p + at, n, MPI_BYTE, from, tag, comm_, &requests_.back()), "MPI_Irecv");
            at += n;
        }
    }
    // Lets pending transfers advance: without an asynchronous progress thread, MPI moves a large
    // message only inside MPI calls, so the ring calls this between pieces of its local work.
    void progress() {
        int done = 0;
        if (!requests_.empty())
            check_mpi(MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &done, MPI_STATUSES_IGNORE),
                      "MPI_Testall");
    }
    // Waits for every transfer posted so far; returns the seconds spent waiting.
    double wait() {
        const double t0 = MPI_Wtime();
        if (!requests_.empty())
            check_mpi(MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE),
                      "MPI_Waitall");
        requests_.clear();
        return MPI_Wtime() - t0;
    }

   private:
    MPI_Comm comm_;
    std::vector<MPI_Request> requests_;
};

}  // namespace detail
}  // namespace distributed
}  // namespace attnkit
