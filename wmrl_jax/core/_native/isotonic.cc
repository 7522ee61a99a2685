// Native CPU kernels for wmrl_jax.core.isotonic, called from XLA through the
// typed FFI (no host round trip: they run on the CPU device's own buffers).
//
// IsotonicFit: per row of [..., n] inputs, sort the valid points by x
// (LSD radix on an order-preserving integer key), pool ties by weighted mean
// (scikit-learn's rule: within the dtype's resolution of a group's first x), run weighted pool-adjacent-violators, and write the knots of the
// fitted piecewise-linear map. IsotonicPredict evaluates those knots with
// clipping and linear interpolation, as scikit-learn's
// IsotonicRegression(out_of_bounds="clip").predict does.
//
// Sums are accumulated in double whatever the buffer type.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// Order-preserving unsigned key of a finite float (-0.0 is canonicalised).
inline uint32_t SortKey(float v) {
  if (v == 0.0f) v = 0.0f;
  uint32_t u;
  std::memcpy(&u, &v, sizeof(u));
  return (u >> 31) ? ~u : (u | 0x80000000u);
}
inline uint64_t SortKey(double v) {
  if (v == 0.0) v = 0.0;
  uint64_t u;
  std::memcpy(&u, &v, sizeof(u));
  return (u >> 63) ? ~u : (u | 0x8000000000000000ull);
}

inline float FromSortKey(uint32_t k) {
  const uint32_t u = (k >> 31) ? (k & 0x7fffffffu) : ~k;
  float v;
  std::memcpy(&v, &u, sizeof(v));
  return v;
}
inline double FromSortKey(uint64_t k) {
  const uint64_t u = (k >> 63) ? (k & 0x7fffffffffffffffull) : ~k;
  double v;
  std::memcpy(&v, &u, sizeof(v));
  return v;
}

// A point to fit, sorted by its x key; carrying y and w inside the item
// turns three random gathers per point after the sort into sequential reads.
template <typename T>
struct FitItem {
  std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t> k;
  T y, w;
  auto key() const { return k; }
};

// Sort items: for float keys, the 32-bit key and the 32-bit index packed in
// one uint64 (half the memory traffic of a struct); for double keys, a pair.
struct PackedItem {
  uint64_t bits;
  uint32_t key() const { return static_cast<uint32_t>(bits >> 32); }
  int64_t index() const { return static_cast<int64_t>(bits & 0xffffffffu); }
  static PackedItem Make(uint32_t key, int64_t index) {
    return {(uint64_t{key} << 32) | static_cast<uint64_t>(index)};
  }
};
struct PairItem {
  uint64_t k;
  int64_t i;
  uint64_t key() const { return k; }
  int64_t index() const { return i; }
  static PairItem Make(uint64_t key, int64_t index) { return {key, index}; }
};
template <typename T>
using ItemFor = std::conditional_t<sizeof(T) == 4, PackedItem, PairItem>;

// Sorts `items` by key: LSD radix (8-bit digits for small inputs, 11-bit for
// large ones) with all digit histograms counted in one pass, skipping digits
// that are equal for every item; insertion sort for tiny inputs. 64-bit keys
// are radix-sorted on their top 32 bits only (sign, exponent and 20 mantissa
// bits of a double), then runs that share those bits are finished by
// comparison sort: for continuous data such runs are short, and it halves
// the number of passes.
template <typename Item>
void SortByKey(std::vector<Item>& items, std::vector<Item>& scratch) {
  const size_t m = items.size();
  auto less = [](const Item& a, const Item& b) { return a.key() < b.key(); };
  if (m < 32) {
    for (size_t i = 1; i < m; ++i) {
      Item v = items[i];
      size_t j = i;
      for (; j > 0 && items[j - 1].key() > v.key(); --j) items[j] = items[j - 1];
      items[j] = v;
    }
    return;
  }
  using Key = decltype(items[0].key());
  constexpr int kKeyBits = 8 * sizeof(Key);
  constexpr int kLowBits = kKeyBits > 32 ? kKeyBits - 32 : 0;  // Left to the fix-up.
  const int bits = m < 65536 ? 8 : 11;
  const size_t buckets = size_t{1} << bits;
  const int passes = (kKeyBits - kLowBits + bits - 1) / bits;
  thread_local std::vector<size_t> count;
  count.assign(buckets * passes, 0);
  for (const auto& it : items) {
    const Key key = it.key() >> kLowBits;
    for (int p = 0; p < passes; ++p) ++count[p * buckets + ((key >> (p * bits)) & (buckets - 1))];
  }
  scratch.resize(m);
  for (int p = 0; p < passes; ++p) {
    size_t* c = &count[p * buckets];
    const int shift = kLowBits + p * bits;
    if (c[(items[0].key() >> shift) & (buckets - 1)] == m) continue;
    size_t offset = 0;
    for (size_t b = 0; b < buckets; ++b) {
      const size_t next = offset + c[b];
      c[b] = offset;
      offset = next;
    }
    for (const auto& it : items) scratch[c[(it.key() >> shift) & (buckets - 1)]++] = it;
    items.swap(scratch);
  }
  if constexpr (kLowBits > 0) {
    for (size_t start = 0; start < m;) {
      size_t end = start + 1;
      while (end < m && (items[end].key() >> kLowBits) == (items[start].key() >> kLowBits)) ++end;
      if (end - start > 1) std::sort(items.begin() + start, items.begin() + end, less);
      start = end;
    }
  }
}

// Runs fn(begin_row, end_row) over [0, rows) on XLA's CPU thread pool. The
// calling thread takes chunks too and only waits for chunks other threads
// have already claimed, so it never blocks on work a busy pool has not
// started; late tasks find no chunk left and touch nothing but `Shared`.
void ParallelRows(ffi::ThreadPool& pool, int64_t rows, int64_t cost_per_row,
                  const std::function<void(int64_t, int64_t)>& fn) {
  const int64_t threads = std::max<int64_t>(pool.num_threads(), 1);
  if (threads == 1 || rows < 2 || rows * cost_per_row < (int64_t{1} << 15)) {
    fn(0, rows);
    return;
  }
  struct Shared {
    std::atomic<int64_t> next{0}, done{0};
    int64_t chunks = 0, rows = 0;
    const std::function<void(int64_t, int64_t)>* fn = nullptr;
    std::mutex mutex;
    std::condition_variable finished;
  };
  auto shared = std::make_shared<Shared>();
  shared->chunks = std::min<int64_t>(rows, 4 * (threads + 1));
  shared->rows = rows;
  shared->fn = &fn;
  auto work = [](const std::shared_ptr<Shared>& sh) {
    for (int64_t c; (c = sh->next.fetch_add(1)) < sh->chunks;) {
      (*sh->fn)(c * sh->rows / sh->chunks, (c + 1) * sh->rows / sh->chunks);
      if (sh->done.fetch_add(1) + 1 == sh->chunks) {
        std::lock_guard<std::mutex> lock(sh->mutex);
        sh->finished.notify_all();
      }
    }
  };
  for (int64_t t = 0; t < threads; ++t) pool.Schedule([shared, work] { work(shared); });
  work(shared);
  std::unique_lock<std::mutex> lock(shared->mutex);
  shared->finished.wait(lock, [&] { return shared->done.load() == shared->chunks; });
}

// Workspace reused across rows and calls (one per thread).
template <typename T>
struct FitWorkspace {
  std::vector<FitItem<T>> order, scratch;
  std::vector<double> bwy, bw;     // PAV blocks: sums
  std::vector<int64_t> bend;       // PAV blocks: one past the last group
};

template <typename T>
int64_t FitRow(const T* x, const T* y, const T* w, int64_t n, bool increasing, T* knot_x,
               T* knot_y, FitWorkspace<T>& ws) {
  const double sign = increasing ? 1.0 : -1.0;
  // The caller has zeroed the weight of every invalid entry.
  ws.order.resize(n);
  int64_t m = 0;
  bool sorted = true;
  for (int64_t i = 0; i < n; ++i) {
    if (!(w[i] > 0)) continue;
    const auto key = SortKey(x[i]);
    sorted &= m == 0 || ws.order[m - 1].key() <= key;
    ws.order[m++] = {key, y[i], w[i]};
  }
  ws.order.resize(m);
  if (!sorted) SortByKey(ws.order, ws.scratch);

  if (m == 0) {
    std::fill(knot_x, knot_x + n, T(0));
    std::fill(knot_y, knot_y + n, T(0));
    return 0;
  }
  // One pass: pool ties in x by weighted mean into a group, and push
  // each completed group onto a stack of PAV blocks, merging the top blocks
  // while they violate monotonicity. Each group is pushed once and each merge
  // pops a block, so the pass is O(m). Ties must be pooled before the push:
  // a block cannot be split again once merged.
  ws.bwy.resize(m);
  ws.bw.resize(m);
  ws.bend.resize(m);
  int64_t g = 0, top = 0;
  double gwy = 0, gw = 0;
  auto push = [&]() {
    ws.bwy[top] = gwy;
    ws.bw[top] = gw;
    ws.bend[top] = ++g;
    ++top;
    // Strict violation only: merging equal means changes no value.
    while (top > 1 && ws.bwy[top - 2] * ws.bw[top - 1] > ws.bwy[top - 1] * ws.bw[top - 2]) {
      ws.bwy[top - 2] += ws.bwy[top - 1];
      ws.bw[top - 2] += ws.bw[top - 1];
      ws.bend[top - 2] = ws.bend[top - 1];
      --top;
    }
  };
  // scikit-learn's tie rule: a point joins the current group while it lies
  // less than the dtype's resolution (1e-6 / 1e-15) above the group's first
  // point, which is the group's knot.
  const T resolution = sizeof(T) == 4 ? T(1e-6) : T(1e-15);
  T group_x = 0;
  for (int64_t j = 0; j < m; ++j) {
    const auto& it = ws.order[j];
    const T xj = FromSortKey(it.k);
    if (j > 0 && xj - group_x >= resolution) {
      push();
      gwy = gw = 0;
    }
    if (gw == 0) knot_x[g] = group_x = xj;
    const double wi = static_cast<double>(it.w);
    gwy += wi * sign * static_cast<double>(it.y);
    gw += wi;
  }
  push();
  int64_t start = 0;
  for (int64_t b = 0; b < top; ++b) {
    const T value = static_cast<T>(sign * (ws.bwy[b] / ws.bw[b]));
    std::fill(knot_y + start, knot_y + ws.bend[b], value);
    start = ws.bend[b];
  }
  std::fill(knot_x + g, knot_x + n, knot_x[g - 1]);
  std::fill(knot_y + g, knot_y + n, knot_y[g - 1]);
  return g;
}

// Linear interpolation between knots lo = hi - 1 and hi, as scipy's interp1d.
template <typename T>
inline T Interp(const T* kx, const T* ky, int64_t hi, T t) {
  const T slope = (ky[hi] - ky[hi - 1]) / (kx[hi] - kx[hi - 1]);
  return slope * (t - kx[hi - 1]) + ky[hi - 1];
}

template <typename T>
void PredictRow(const T* kx, const T* ky, int64_t k, const T* t, int64_t m, T* out,
                std::vector<ItemFor<T>>& order, std::vector<ItemFor<T>>& scratch) {
  if (k == 0) {  // Empty fit: the identity map.
    std::copy(t, t + m, out);
    return;
  }
  if (k == 1) {
    std::fill(out, out + m, ky[0]);
    return;
  }
  const T lo = kx[0], hi = kx[k - 1];
  auto clip = [&](T v) { return v < lo ? lo : (v > hi ? hi : v); };
  // Many queries against many knots: visit the queries in sorted order and
  // walk the knots once, instead of one cache-missing binary search each.
  if (m >= 32 && k >= 32) {
    order.resize(m);
    int64_t valid = 0;
    for (int64_t q = 0; q < m; ++q) {
      if (std::isnan(t[q])) {
        out[q] = t[q];
      } else {
        order[valid++] = ItemFor<T>::Make(SortKey(clip(t[q])), q);
      }
    }
    order.resize(valid);
    SortByKey(order, scratch);
    int64_t j = 1;
    for (const auto& it : order) {
      const T v = clip(t[it.index()]);
      while (j < k - 1 && kx[j] < v) ++j;
      out[it.index()] = Interp(kx, ky, j, v);
    }
    return;
  }
  for (int64_t q = 0; q < m; ++q) {
    if (std::isnan(t[q])) {
      out[q] = t[q];
      continue;
    }
    const T v = clip(t[q]);
    int64_t j = std::lower_bound(kx, kx + k, v) - kx;
    j = std::min<int64_t>(std::max<int64_t>(j, 1), k - 1);
    out[q] = Interp(kx, ky, j, v);
  }
}

int64_t Rows(const ffi::AnyBuffer& b, int64_t* last) {
  auto dims = b.dimensions();
  *last = dims.size() ? dims.back() : 1;
  return *last ? static_cast<int64_t>(b.element_count()) / *last : 0;
}

template <typename T>
ffi::Error FitTyped(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::AnyBuffer y, ffi::AnyBuffer w,
                    ffi::Result<ffi::AnyBuffer> kx, ffi::Result<ffi::AnyBuffer> ky,
                    ffi::Result<ffi::AnyBuffer> nk, bool increasing) {
  int64_t n;
  const int64_t rows = Rows(x, &n);
  int32_t* counts = nk->typed_data<int32_t>();
  ParallelRows(pool, rows, n, [&](int64_t begin, int64_t end) {
    // Reused across calls: fresh large allocations would page-fault on every
    // call, which costs more than the fit itself at n >= 1e5.
    thread_local FitWorkspace<T> ws;
    for (int64_t r = begin; r < end; ++r) {
      counts[r] = static_cast<int32_t>(
          FitRow<T>(x.typed_data<T>() + r * n, y.typed_data<T>() + r * n,
                    w.typed_data<T>() + r * n, n, increasing, kx->typed_data<T>() + r * n,
                    ky->typed_data<T>() + r * n, ws));
    }
  });
  return ffi::Error::Success();
}

ffi::Error FitImpl(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::AnyBuffer y, ffi::AnyBuffer w,
                   ffi::Result<ffi::AnyBuffer> kx, ffi::Result<ffi::AnyBuffer> ky,
                   ffi::Result<ffi::AnyBuffer> nk, bool increasing) {
  if (x.element_count() != y.element_count() || x.element_count() != w.element_count() ||
      x.element_type() != y.element_type() || x.element_type() != w.element_type()) {
    return ffi::Error::InvalidArgument("isotonic_fit: x, y, weights must match in shape/dtype");
  }
  switch (x.element_type()) {
    case ffi::DataType::F32:
      return FitTyped<float>(pool, x, y, w, kx, ky, nk, increasing);
    case ffi::DataType::F64:
      return FitTyped<double>(pool, x, y, w, kx, ky, nk, increasing);
    default:
      return ffi::Error::InvalidArgument("isotonic_fit: only float32 and float64 are supported");
  }
}

template <typename T>
ffi::Error PredictTyped(ffi::ThreadPool pool, ffi::AnyBuffer kx, ffi::AnyBuffer ky,
                        ffi::AnyBuffer nk, ffi::AnyBuffer t, ffi::Result<ffi::AnyBuffer> out) {
  int64_t n, m;
  const int64_t rows = Rows(kx, &n);
  Rows(t, &m);
  const int32_t* counts = nk.typed_data<int32_t>();
  ParallelRows(pool, rows, m, [&](int64_t begin, int64_t end) {
    thread_local std::vector<ItemFor<T>> order, scratch;
    for (int64_t r = begin; r < end; ++r) {
      PredictRow<T>(kx.typed_data<T>() + r * n, ky.typed_data<T>() + r * n, counts[r],
                    t.typed_data<T>() + r * m, m, out->typed_data<T>() + r * m, order, scratch);
    }
  });
  return ffi::Error::Success();
}

ffi::Error PredictImpl(ffi::ThreadPool pool, ffi::AnyBuffer kx, ffi::AnyBuffer ky, ffi::AnyBuffer nk, ffi::AnyBuffer t,
                       ffi::Result<ffi::AnyBuffer> out) {
  if (kx.element_type() != t.element_type() || ky.element_type() != t.element_type()) {
    return ffi::Error::InvalidArgument("isotonic_predict: knots and queries must share a dtype");
  }
  switch (t.element_type()) {
    case ffi::DataType::F32:
      return PredictTyped<float>(pool, kx, ky, nk, t, out);
    case ffi::DataType::F64:
      return PredictTyped<double>(pool, kx, ky, nk, t, out);
    default:
      return ffi::Error::InvalidArgument(
          "isotonic_predict: only float32 and float64 are supported");
  }
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(WmrlIsotonicFit, FitImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<bool>("increasing"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(WmrlIsotonicPredict, PredictImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());
