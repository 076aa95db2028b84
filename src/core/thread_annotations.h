// The annotations of clang's thread-safety analysis (-Wthread-safety): what data a mutex
// guards, which functions expect it held or not, and which types are mutexes or hold one for
// a scope. Only clang reads them, in `make thread-safety` (scripts/check_thread_safety.py),
// which runs it syntax-only as an error; the project builds with GCC, under which every macro
// expands to nothing. core/mutex.h is the mutex they apply to: libstdc++'s std::mutex is not
// a capability, so GUARDED_BY a std::mutex would never be checked.
//
//   GUARDED_BY(mu)        a field (or a global, or a function-local static) read or written
//                         only with mu held
//   PT_GUARDED_BY(mu)     the same for what a pointer field points to
//   REQUIRES(mu)          the caller must hold mu
//   EXCLUDES(mu)          the caller must not hold mu (the function takes it)
//   ACQUIRE / RELEASE     the function takes / gives back the capability
//   CAPABILITY(name)      the type is a mutex
//   SCOPED_CAPABILITY     the type holds a mutex from its constructor to its destructor
//   NO_THREAD_SAFETY_ANALYSIS  the function is left out; say why beside it
#pragma once

#if defined(__clang__)
#define ZDP_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define ZDP_THREAD_ANNOTATION(x)
#endif

#define CAPABILITY(x) ZDP_THREAD_ANNOTATION(capability(x))
#define SCOPED_CAPABILITY ZDP_THREAD_ANNOTATION(scoped_lockable)
#define GUARDED_BY(x) ZDP_THREAD_ANNOTATION(guarded_by(x))
#define PT_GUARDED_BY(x) ZDP_THREAD_ANNOTATION(pt_guarded_by(x))
#define REQUIRES(...) ZDP_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define EXCLUDES(...) ZDP_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define ACQUIRE(...) ZDP_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define RELEASE(...) ZDP_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define NO_THREAD_SAFETY_ANALYSIS ZDP_THREAD_ANNOTATION(no_thread_safety_analysis)
