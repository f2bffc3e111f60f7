// ThreadSanitizer support for Debian's Abseil: linked into every binary built with
// --config=tsan (.bazelrc: --custom_malloc=//tools/tsan:absl_mutex_annotations), nowhere else.
//
// Why: Debian's libabsl_synchronization.so is not built with -fsanitize=thread, so TSAN cannot
// see that absl::Mutex orders memory accesses (it locks with atomics and futex calls inside an
// uninstrumented library, not with pthread functions TSAN intercepts). Every access guarded by
// an absl::Mutex in comm/ was then reported as a data race (about 4,500 reports in
// communicator_test alone, which also made the run take more than 6 minutes), and a real race
// could not be told from the noise.
//
// How: this file defines absl::Mutex's out-of-line lock functions in the executable (the
// library is linkstatic, so they come first in symbol lookup). The dynamic linker binds every
// call to them to these definitions, which call the library's originals (dlsym(RTLD_NEXT)) and
// tell TSAN about the ordering: __tsan_release(mu) before an unlock (including the unlock
// inside Await), __tsan_acquire(mu) after a lock. Conditions are wrapped so that their
// evaluation inside the library (see GuardedCondition) is ordered too. That is the
// happens-before a mutex gives, so races on data the mutex does not guard are still reported
// (checked with a deliberately racy counter next to a Mutex-guarded one: 1 report with the
// shim, 2 without). The mangled names are those of Debian's libabsl 20220623 (inline namespace
// "debian3"); if a future Abseil renames them, dlsym fails and the binary aborts saying so.
// Not covered: absl::CondVar and absl::Notification (unused in gossipcc).
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>

#include "absl/synchronization/mutex.h"

extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);

namespace {

template <typename Fn>
Fn Real(const char* mangled) {
  void* f = dlsym(RTLD_NEXT, mangled);
  if (f == nullptr) {
    std::fprintf(stderr, "tools/tsan/absl_mutex_annotations.cc: %s not found (%s)\n", mangled, dlerror());
    std::abort();
  }
  return reinterpret_cast<Fn>(f);
}

#define ABSL_MUTEX_SYM(name) "_ZN4absl7debian35Mutex" name

// The library evaluates a Condition with the mutex held, but in between our hooks: in the
// waiting thread right after it re-took the lock internally (and, if false, unlocks again
// internally), or in the unlocking thread. So each Condition handed to the library is wrapped
// to acquire before and release after the evaluation.
struct GuardedCondition {
  void* mu;
  const absl::Condition* cond;
};

bool EvalAfterAcquire(GuardedCondition* g) {
  __tsan_acquire(g->mu);
  const bool res = g->cond->Eval();
  __tsan_release(g->mu);  // if false, the library unlocks internally next
  return res;
}

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

void Mutex::Lock() {
  static auto real = Real<void (*)(Mutex*)>(ABSL_MUTEX_SYM("4LockEv"));
  real(this);
  __tsan_acquire(this);
}

void Mutex::ReaderLock() {
  static auto real = Real<void (*)(Mutex*)>(ABSL_MUTEX_SYM("10ReaderLockEv"));
  real(this);
  __tsan_acquire(this);
}

bool Mutex::TryLock() {
  static auto real = Real<bool (*)(Mutex*)>(ABSL_MUTEX_SYM("7TryLockEv"));
  const bool locked = real(this);
  if (locked) __tsan_acquire(this);
  return locked;
}

bool Mutex::ReaderTryLock() {
  static auto real = Real<bool (*)(Mutex*)>(ABSL_MUTEX_SYM("13ReaderTryLockEv"));
  const bool locked = real(this);
  if (locked) __tsan_acquire(this);
  return locked;
}

void Mutex::Unlock() {
  static auto real = Real<void (*)(Mutex*)>(ABSL_MUTEX_SYM("6UnlockEv"));
  __tsan_release(this);
  real(this);
}

void Mutex::ReaderUnlock() {
  static auto real = Real<void (*)(Mutex*)>(ABSL_MUTEX_SYM("12ReaderUnlockEv"));
  __tsan_release(this);
  real(this);
}

void Mutex::LockWhen(const Condition& cond) {
  static auto real = Real<void (*)(Mutex*, const Condition&)>(ABSL_MUTEX_SYM("8LockWhenERKNS0_9ConditionE"));
  GuardedCondition g{this, &cond};
  const Condition wrapped(&EvalAfterAcquire, &g);
  __tsan_release(this);  // the unlocking thread may evaluate `cond` (see GuardedCondition)
  real(this, wrapped);
  __tsan_acquire(this);
}

bool Mutex::LockWhenWithTimeout(const Condition& cond, absl::Duration timeout) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, absl::Duration)>(
      ABSL_MUTEX_SYM("19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE"));
  GuardedCondition g{this, &cond};
  const Condition wrapped(&EvalAfterAcquire, &g);
  __tsan_release(this);  // the unlocking thread may evaluate `cond` (see GuardedCondition)
  const bool res = real(this, wrapped, timeout);
  __tsan_acquire(this);  // held on return either way
  return res;
}

// Await releases the mutex while it waits and holds it again on return.
void Mutex::Await(const Condition& cond) {
  static auto real = Real<void (*)(Mutex*, const Condition&)>(ABSL_MUTEX_SYM("5AwaitERKNS0_9ConditionE"));
  GuardedCondition g{this, &cond};
  const Condition wrapped(&EvalAfterAcquire, &g);
  __tsan_release(this);
  real(this, wrapped);
  __tsan_acquire(this);
}

bool Mutex::AwaitWithTimeout(const Condition& cond, absl::Duration timeout) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, absl::Duration)>(
      ABSL_MUTEX_SYM("16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE"));
  GuardedCondition g{this, &cond};
  const Condition wrapped(&EvalAfterAcquire, &g);
  __tsan_release(this);
  const bool res = real(this, wrapped, timeout);
  __tsan_acquire(this);
  return res;
}

ABSL_NAMESPACE_END
}  // namespace absl
