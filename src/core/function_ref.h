// FunctionRef: a non-owning reference to a callable, for parameters that are called during the
// call and not kept (ThreadPool::ParallelFor's body). Unlike std::function it never allocates,
// whatever the lambda captures: the hot loops pass lambdas with many captured references
// hundreds of times per token.
#pragma once

#include <type_traits>
#include <utility>

namespace substrate {

template <typename Signature>
class FunctionRef;

template <typename R, typename... Args>
class FunctionRef<R(Args...)> {
 public:
  // `f` must outlive every call through this reference.
  template <typename F, typename = std::enable_if_t<
                            !std::is_same_v<std::decay_t<F>, FunctionRef> &&
                            std::is_invocable_r_v<R, F&, Args...>>>
  FunctionRef(F&& f)  // NOLINT: implicit, as std::function's
      : obj_(const_cast<void*>(static_cast<const void*>(&f))),
        call_([](void* obj, Args... args) -> R {
          return (*static_cast<std::remove_reference_t<F>*>(obj))(std::forward<Args>(args)...);
        }) {}

  R operator()(Args... args) const { return call_(obj_, std::forward<Args>(args)...); }

 private:
  void* obj_;
  R (*call_)(void*, Args...);
};

}  // namespace substrate
