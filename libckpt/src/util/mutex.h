// `Mutex`: a std::mutex with absl::Mutex-style `Await(condition)`.
//
// Debian's Abseil is built without ThreadSanitizer annotations, so TSAN
// cannot see absl::Mutex acquire and release and reports false races;
// std::mutex goes through pthread, which TSAN intercepts. Every unlock
// through `MutexLock` wakes all waiters, which re-check their conditions
// (like absl::Mutex). The locks in ckpt are taken per chunk or per save,
// never per byte, so the broadcast costs nothing measurable.
#ifndef CKPT_UTIL_MUTEX_H_
#define CKPT_UTIL_MUTEX_H_

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"

namespace ckpt::internal {

class ABSL_LOCKABLE Mutex {
 public:
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  // Wakes every `Await`er and unlocks. The wake comes first, while the lock
  // is held: a waiter that sees its condition may return and destroy the
  // object this mutex lives in (a save's job, a queue) as soon as the lock is
  // free, and a broadcast on a destroyed condition variable is undefined (in
  // glibc it can block for ever).
  void Unlock() ABSL_UNLOCK_FUNCTION() {
    cv_.notify_all();
    mu_.unlock();
  }
  // Unlocks without waking waiters: for updates no waiter needs to see at
  // once (a later `Unlock` or a waiter's own polling picks them up).
  void UnlockQuietly() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  // REQUIRES: held. Waits (releasing the lock meanwhile) until `condition()`.
  template <typename Condition>
  void Await(Condition condition) {
    std::unique_lock<std::mutex> lock(mu_, std::adopt_lock);
    cv_.wait(lock, condition);
    lock.release();
  }
  // As `Await`, giving up after `timeout`; returns `condition()`.
  template <typename Condition>
  bool AwaitWithTimeout(Condition condition, absl::Duration timeout) {
    std::unique_lock<std::mutex> lock(mu_, std::adopt_lock);
    const bool met = cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), condition);
    lock.release();
    return met;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
};

class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

}  // namespace ckpt::internal

#endif  // CKPT_UTIL_MUTEX_H_
