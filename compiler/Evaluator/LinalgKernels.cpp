// Linear-algebra reference kernels: Gemm and numpy-style MatMul.
#include "compiler/Evaluator/KernelsInternal.h"

namespace pipec::eval::kernels {

using namespace detail;

Tensor gemm(const Tensor &a, const Tensor &b, const Tensor *c, double alpha, double beta,
            bool transA, bool transB) {
  requireFloating(a, "A");
  if (a.shape.size() != 2 || b.shape.size() != 2)
    throw EvalError("A and B must be 2-D, got " + shapeToString(a.shape) + " and " +
                    shapeToString(b.shape));
  int64_t m = a.shape[transA ? 1 : 0], k = a.shape[transA ? 0 : 1];
  int64_t kb = b.shape[transB ? 1 : 0], n = b.shape[transB ? 0 : 1];
  if (k != kb)
    throw EvalError("inner dimensions differ (" + std::to_string(k) + " vs " +
                    std::to_string(kb) + ")");
  if (c && broadcastTwo(c->shape, {m, n}) != std::vector<int64_t>{m, n})
    throw EvalError("C of shape " + shapeToString(c->shape) + " does not broadcast to [" +
                    std::to_string(m) + "," + std::to_string(n) + "]");
  Tensor out = zeros(a.kind, {m, n});
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0;
      for (int64_t p = 0; p < k; ++p) {
        double av = a.floats[transA ? p * m + i : i * k + p];
        double bv = b.floats[transB ? j * k + p : p * n + j];
        sum += av * bv;
      }
      double value = alpha * sum;
      if (c)
        value += beta * c->floats[broadcastOffset({i, j}, c->shape)];
      out.floats[i * n + j] = value;
    }
  return finish(std::move(out));
}

Tensor matmul(const Tensor &a, const Tensor &b) {
  requireFloating(a, "A");
  if (a.kind != b.kind)
    throw EvalError("operand element types differ");
  requireRank(a, 1, "A");
  requireRank(b, 1, "B");
  std::vector<int64_t> aShape = a.shape, bShape = b.shape;
  bool vectorA = aShape.size() == 1, vectorB = bShape.size() == 1;
  if (vectorA)
    aShape.insert(aShape.begin(), 1);
  if (vectorB)
    bShape.push_back(1);
  int64_t m = aShape[aShape.size() - 2], k = aShape.back();
  int64_t kb = bShape[bShape.size() - 2], n = bShape.back();
  if (k != kb)
    throw EvalError("inner dimensions differ for " + shapeToString(a.shape) + " x " +
                    shapeToString(b.shape));
  std::vector<int64_t> aBatch(aShape.begin(), aShape.end() - 2);
  std::vector<int64_t> bBatch(bShape.begin(), bShape.end() - 2);
  std::vector<int64_t> batch = broadcastTwo(aBatch, bBatch);
  Tensor out = zeros(a.kind, [&] {
    std::vector<int64_t> shape = batch;
    if (!vectorA)
      shape.push_back(m);
    if (!vectorB)
      shape.push_back(n);
    return shape;
  }());
  int64_t batchIndex = 0;
  auto visit = [&](const std::vector<int64_t> &index) {
    // The batch offsets count whole matrices of each operand.
    int64_t aBase = broadcastOffset(index, aBatch) * m * k;
    int64_t bBase = broadcastOffset(index, bBatch) * k * n;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double sum = 0;
        for (int64_t p = 0; p < k; ++p)
          sum += a.floats[aBase + i * k + p] * b.floats[bBase + p * n + j];
        out.floats[batchIndex * m * n + i * n + j] = sum;
      }
    ++batchIndex;
  };
  if (batch.empty())
    visit({});
  else
    forEachIndex(batch, visit);
  return finish(std::move(out));
}

} // namespace pipec::eval::kernels
