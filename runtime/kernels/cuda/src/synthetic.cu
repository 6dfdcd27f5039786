// piperun's synthetic data set generated on the device (docs/runtime.md,
// "Data read ahead"): the values io::SyntheticData::read writes on the
// host, bit for bit, from the one definition in pipec/synthetic_data.h.
#include "detail.cuh"
#include "index_map.cuh"

namespace pipec::kernels::cuda {

namespace {

/// Element i of `count` consecutive samples from `first`, flat.
template <class T>
__global__ void syntheticDataKernel(T *out, io::SyntheticField field, uint64_t first, int64_t n) {
  for (int64_t i = detail::firstIndex(); i < n; i += detail::gridStride()) {
    const int64_t sample = i / field.sampleElements, e = i - sample * field.sampleElements;
    out[i] = io::syntheticValue<T>(field, io::syntheticSampleKey(field, first + (uint64_t)sample), e);
  }
}

template <class T> void launchSyntheticData(const io::SyntheticField &field, uint64_t first, int64_t n, void *out) {
  syntheticDataKernel<T><<<detail::blocksFor(n), detail::kThreads, 0, detail::stream()>>>(static_cast<T *>(out),
                                                                                          field, first, n);
  detail::checkLaunch("syntheticData");
}

} // namespace

void syntheticData(const io::SyntheticField &field, uint64_t first, uint64_t count, void *out) {
  if (field.sampleElements <= 0 || count == 0) return;
  if (count > (uint64_t)INT64_MAX / (uint64_t)field.sampleElements)
    detail::fail("syntheticData", std::to_string(count) + " samples of " + std::to_string(field.sampleElements) +
                                      " elements overflow int64");
  const int64_t n = (int64_t)count * field.sampleElements;
  const bool known = io::withSyntheticType(
      field.dtype, [&](auto zero) { launchSyntheticData<decltype(zero)>(field, first, n, out); });
  if (!known)
    detail::fail("syntheticData", "dtype " + std::to_string(field.dtype) + " is not f32, f64, i64, i32 or bool");
}

} // namespace pipec::kernels::cuda
