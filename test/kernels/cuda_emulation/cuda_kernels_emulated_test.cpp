// cuda-kernels-emulated: every public kernel of pipec's CUDA library
// (runtime/kernels/cuda, pipec/cuda_kernels.h) against the CPU library
// (pipec/cpu_kernels.h) on random and edge-case shapes, with the CUDA sources
// translated by prep.py and run on the host under emu.h (no GPU, no nvcc).
//
// What it proves: the kernels' indexing, grid-stride loops, launch
// configurations (grid/block limits are checked), block reductions
// (__syncthreads and __shfl_down_sync really wait; blocks and threads run in
// orders that vary by launch and block, so a missing barrier shows as a wrong
// result and a divergent or partial one aborts), the host-side plans
// (broadcasting, axes, empty tensors, cuBLAS argument checks and transposes), device error flags, that all work goes to
// the scope's stream (inc/cuda_runtime.h aborts otherwise), and that no kernel
// reads scratch it did not write (cudaMallocAsync memory is NaN-filled).
//
// What it cannot: real warp scheduling and memory ordering (threads of a block
// interleave only at barriers, so races between barriers and missing
// __syncwarp/fences go unseen), FMA contraction and the device's math
// library (everything is host float, -ffp-contract=off), TF32/BF16 numerics
// (the fake cuBLAS computes in double), real device memory (no coalescing,
// alignment, out-of-bounds faults beyond what the host would see), and
// timing. A GPU run of the library is still the final word.
//
// usage: cuda_kernels_emulated_test [group]   (group: empty, elementwise, ...)
#include "pipec/cuda_kernels.h"
#include "pipec/cpu_kernels.h"
#include "kernel_plan.h" // plan::cudaAttentionBlockBytes
#include "cuda_runtime.h"
#include "emu.h"
#include "cublasLt.h"
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace pk = pipec::kernels;
namespace pc = pipec::kernels::cuda;
using pk::Dims;
using pk::Shape;

static std::mt19937_64 rng(12345);
static int failures = 0, checks = 0;
static std::string ctx;

static std::vector<float> randv(int64_t n, float lo = -2, float hi = 2) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v((size_t)n);
  for (auto &x : v) x = d(rng);
  return v;
}
static int64_t ri(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); }

template <class T>
static void cmp(const std::vector<T> &cpu, const std::vector<T> &gpu, double tol, const char *what) {
  ++checks;
  if (cpu.size() != gpu.size()) { std::printf("FAIL %s %s: size\n", ctx.c_str(), what); ++failures; return; }
  for (size_t i = 0; i < cpu.size(); ++i) {
    const double a = (double)cpu[i], b = (double)gpu[i];
    const bool bothNan = std::isnan(a) && std::isnan(b);
    if (bothNan) continue;
    if (std::isinf(a) && a == b) continue;
    if (!(std::fabs(a - b) <= tol * (1 + std::fabs(a)))) {
      std::printf("FAIL %s %s: [%zu] cpu %.9g gpu %.9g (n=%zu)\n", ctx.c_str(), what, i, a, b, cpu.size());
      ++failures;
      return;
    }
  }
}

// Expect a thrown error (either side)
template <class F> static bool throws(F f) { try { f(); } catch (const pk::KernelError &) { return true; } return false; }

static Shape randShape(int rank, int64_t maxDim) { Shape s; for (int i = 0; i < rank; ++i) s.push(ri(1, maxDim)); return s; }
static Shape bcastOf(const Shape &s) { // random broadcast-compatible shape
  Shape r; int drop = (int)ri(0, s.size);
  for (int i = drop; i < s.size; ++i) r.push(ri(0, 2) == 0 ? 1 : s.v[i]);
  return r;
}

static void testElementwise() {
  for (int it = 0; it < 60; ++it) {
    Shape os = randShape((int)ri(0, 4), 5);
    Shape as = ri(0, 1) ? os : bcastOf(os), bs = bcastOf(os);
    if (ri(0, 1)) std::swap(as, bs);
    Shape rs = pk::broadcastShape(as, bs);
    auto a = randv(as.numel(), 0.1f, 2), b = randv(bs.numel(), -2, 2);
    for (int op = 0; op < 5; ++op) {
      ctx = "binary op " + std::to_string(op) + " " + as.str() + bs.str();
      std::vector<float> c(rs.numel()), g(rs.numel());
      pk::binary((pk::Binary)op, a.data(), as, b.data(), bs, c.data());
      pc::binary((pk::Binary)op, a.data(), as, b.data(), bs, g.data());
      cmp(c, g, 1e-6, "out");
    }
    std::vector<int64_t> ia(as.numel()), ib(bs.numel());
    for (auto &x : ia) x = ri(-50, 50);
    for (auto &x : ib) { x = ri(-5, 5); if (!x) x = 3; }
    for (int op = 0; op < 4; ++op) {
      ctx = "ibinary op " + std::to_string(op);
      std::vector<int64_t> c(rs.numel()), g(rs.numel());
      pk::binary((pk::Binary)op, ia.data(), as, ib.data(), bs, c.data());
      pc::binary((pk::Binary)op, ia.data(), as, ib.data(), bs, g.data());
      cmp(c, g, 0, "out");
    }
    { // equal / where
      std::vector<float> ea(as.numel()), eb(bs.numel());
      for (auto &x : ea) x = (float)ri(0, 2);
      for (auto &x : eb) x = (float)ri(0, 2);
      std::vector<uint8_t> c(rs.numel()), g(rs.numel());
      ctx = "equal";
      pk::equal(ea.data(), as, eb.data(), bs, c.data());
      pc::equal(ea.data(), as, eb.data(), bs, g.data());
      cmp(c, g, 0, "eq");
      Shape cs = bcastOf(rs);
      std::vector<uint8_t> cond(cs.numel());
      for (auto &x : cond) x = (uint8_t)ri(0, 1);
      Shape ws = pk::broadcastShape(cs, rs);
      std::vector<float> wc(ws.numel()), wg(ws.numel());
      ctx = "where";
      pk::where(cond.data(), cs, a.data(), as, b.data(), bs, wc.data());
      pc::where(cond.data(), cs, a.data(), as, b.data(), bs, wg.data());
      cmp(wc, wg, 0, "where");
    }
    { // binaryGrad
      for (int op = 0; op < 4; ++op) {
        ctx = "binaryGrad " + std::to_string(op) + as.str() + bs.str();
        auto dy = randv(rs.numel());
        std::vector<float> c(rs.numel()), g(rs.numel());
        pk::binaryGrad((pk::BinaryGrad)op, dy.data(), a.data(), as, b.data(), bs, c.data());
        pc::binaryGrad((pk::BinaryGrad)op, dy.data(), a.data(), as, b.data(), bs, g.data());
        cmp(c, g, 1e-5, "dx");
      }
    }
  }
  for (int op = 0; op < pipec::kNumUnaryFunctions; ++op) { // every function of vocabulary.h's table
    int64_t n = ri(1, 3000);
    auto x = randv(n, (pk::Unary)op == pk::Unary::Sqrt ? 0.f : -3.f, 3), dy = randv(n);
    std::vector<float> c(n), g(n), dc(n), dg(n);
    ctx = std::string("unary ") + pipec::kUnaryFunctions[op].spelling;
    pk::unary((pk::Unary)op, x.data(), n, c.data());
    pc::unary((pk::Unary)op, x.data(), n, g.data());
    cmp(c, g, 1e-6, "y");
    pk::unaryGrad((pk::Unary)op, dy.data(), x.data(), c.data(), n, dc.data());
    pc::unaryGrad((pk::Unary)op, dy.data(), x.data(), c.data(), n, dg.data());
    cmp(dc, dg, 1e-5, "dx");
  }
  {
    int64_t n = 777;
    auto x = randv(n, -300, 300);
    std::vector<int32_t> c(n), g(n);
    ctx = "cast";
    pk::cast(x.data(), n, c.data());
    pc::cast(x.data(), n, g.data());
    cmp(c, g, 0, "cast f->i32");
    std::vector<uint8_t> c8(n), g8(n);
    pk::cast(x.data(), n, c8.data());
    pc::cast(x.data(), n, g8.data());
    cmp(c8, g8, 0, "cast f->u8");
  }
  for (int t = 0; t < 2; ++t) {
    int64_t n = 5000;
    auto x = randv(n), dy = randv(n);
    std::vector<float> c(n), g(n), dc(n), dg(n);
    std::vector<uint8_t> mc(n), mg(n);
    ctx = "dropout";
    // The CUDA call reads its key as generated stages pass it: the call's
    // part from (emulated) device memory, combined with the op's id there.
    const uint64_t callKey = pk::dropoutCallKey(7, 2, 5), key = pk::dropoutOpStreamKey(callKey, 777);
    pk::dropout(x.data(), n, c.data(), mc.data(), 0.3f, t, key);
    pc::dropout(x.data(), n, g.data(), mg.data(), 0.3f, t, pc::StreamKey(&callKey, 777));
    cmp(c, g, 0, "y");
    cmp(mc, mg, 0, "mask");
    pk::dropoutGrad(dy.data(), mc.data(), n, dc.data(), 0.3f, t);
    pc::dropoutGrad(dy.data(), mg.data(), n, dg.data(), 0.3f, t);
    cmp(dc, dg, 0, "dx");
    // The mask drawn again from the forward's key: the stored mask's bits.
    std::vector<float> rg(n);
    pc::dropoutGradRedrawn(dy.data(), n, rg.data(), 0.3f, t, key);
    cmp(dc, rg, 0, "dx redrawn");
  }
}

static void testMovement() {
  for (int it = 0; it < 40; ++it) {
    Shape ds = randShape((int)ri(1, 4), 5);
    int axis = (int)ri(0, ds.size - 1);
    Shape is = randShape((int)ri(0, 2), 4);
    std::vector<int64_t> idx(is.numel());
    for (auto &x : idx) x = ri(-ds.v[axis], ds.v[axis] - 1);
    Shape os;
    for (int i = 0; i < axis; ++i) os.push(ds.v[i]);
    for (int i = 0; i < is.size; ++i) os.push(is.v[i]);
    for (int i = axis + 1; i < ds.size; ++i) os.push(ds.v[i]);
    auto d = randv(ds.numel());
    std::vector<float> c(os.numel()), g(os.numel());
    ctx = "gather " + ds.str() + is.str() + " axis " + std::to_string(axis);
    pk::gather(d.data(), ds, idx.data(), is, axis - (int)ri(0, 1) * ds.size, c.data());
    pc::gather(d.data(), ds, idx.data(), is, axis, g.data());
    cmp(c, g, 0, "out");
    auto dy = randv(os.numel());
    std::vector<float> dc(ds.numel()), dg(ds.numel());
    pk::gatherGrad(dy.data(), idx.data(), is, axis, dc.data(), ds);
    pc::gatherGrad(dy.data(), idx.data(), is, axis, dg.data(), ds);
    cmp(dc, dg, 1e-6, "dx");
    // transpose
    Dims perm;
    for (int i = 0; i < ds.size; ++i) perm.push(i);
    std::shuffle(perm.v, perm.v + perm.size, rng);
    std::vector<float> tc(ds.numel()), tg(ds.numel());
    ctx = "transpose";
    pk::transpose(d.data(), ds, perm, tc.data());
    pc::transpose(d.data(), ds, perm, tg.data());
    cmp(tc, tg, 0, "y");
    // concat/split
    int cnt = (int)ri(1, 10); // more than 8 pieces: a second launch (movement.cu's copyPieces)
    std::vector<Shape> shapes;
    std::vector<std::vector<float>> ins;
    std::vector<const float *> ptrs;
    Dims sizes;
    int64_t tot = 0;
    for (int i = 0; i < cnt; ++i) {
      Shape s = ds;
      s.v[axis] = ri(0, 3);
      sizes.push(s.v[axis]);
      tot += s.v[axis];
      shapes.push_back(s);
      ins.push_back(randv(s.numel()));
    }
    for (auto &v : ins) ptrs.push_back(v.data());
    Shape cs = ds;
    cs.v[axis] = tot;
    std::vector<float> cc(cs.numel()), cg(cs.numel());
    ctx = "concat";
    pk::concat(ptrs.data(), shapes.data(), cnt, axis, cc.data());
    pc::concat(ptrs.data(), shapes.data(), cnt, axis, cg.data());
    cmp(cc, cg, 0, "y");
    std::vector<std::vector<float>> oc, og;
    std::vector<float *> pcs, pgs;
    for (auto &s : shapes) { oc.emplace_back(s.numel()); og.emplace_back(s.numel()); }
    for (int i = 0; i < cnt; ++i) { pcs.push_back(oc[i].data()); pgs.push_back(og[i].data()); }
    ctx = "split";
    pk::split(cc.data(), cs, axis, sizes, pcs.data());
    pc::split(cc.data(), cs, axis, sizes, pgs.data());
    for (int i = 0; i < cnt; ++i) cmp(oc[i], og[i], 0, "piece");
    // slice
    Dims st, en, sp;
    for (int a = 0; a < ds.size; ++a) {
      int64_t dim = ds.v[a], step = ri(1, 3) * (ri(0, 1) ? 1 : -1);
      if (step > 0) { int64_t s0 = ri(0, dim), e0 = ri(0, dim); st.push(s0); en.push(e0); }
      else { int64_t s0 = ri(-1, dim - 1), e0 = ri(-1, dim - 1); st.push(s0); en.push(e0); }
      sp.push(step);
    }
    Shape ss = pk::sliceShape(ds, st, en, sp);
    std::vector<float> sc(ss.numel()), sg(ss.numel());
    ctx = "slice " + ds.str() + st.str() + en.str() + sp.str();
    pk::slice(d.data(), ds, st, en, sp, sc.data());
    pc::slice(d.data(), ds, st, en, sp, sg.data());
    cmp(sc, sg, 0, "y");
    auto sdy = randv(ss.numel());
    std::vector<float> sdc(ds.numel()), sdg(ds.numel());
    pk::sliceGrad(sdy.data(), sdc.data(), ds, st, en, sp);
    pc::sliceGrad(sdy.data(), sdg.data(), ds, st, en, sp);
    cmp(sdc, sdg, 0, "dx");
    // pad
    Dims pads;
    Shape ps;
    for (int a = 0; a < 2 * ds.size; ++a) pads.push(ri(0, 2));
    for (int a = 0; a < ds.size; ++a) ps.push(ds.v[a] + pads.v[a] + pads.v[a + ds.size]);
    std::vector<float> pcv(ps.numel()), pgv(ps.numel());
    ctx = "pad";
    pk::pad(d.data(), ds, pads, 1.5f, pcv.data());
    pc::pad(d.data(), ds, pads, 1.5f, pgv.data());
    cmp(pcv, pgv, 0, "y");
    // expand
    Shape xs = bcastOf(ds);
    auto xv = randv(xs.numel());
    std::vector<float> ec(ds.numel()), eg(ds.numel());
    ctx = "expand";
    pk::expand(xv.data(), xs, ec.data(), ds);
    pc::expand(xv.data(), xs, eg.data(), ds);
    cmp(ec, eg, 0, "y");
  }
}

static void testReduce2() {
  std::vector<std::pair<Shape, Dims>> cases = {{Shape{3, 300}, Dims{1}}, {Shape{300, 5}, Dims{0}}, {Shape{2, 20, 30}, Dims{1, 2}},
      {Shape{2000, 300}, Dims{0}}, {Shape{1100, 260}, Dims{1}}, {Shape{4, 300, 3}, Dims{1}}, {Shape{20, 20, 3}, Dims{0, 1}}, {Shape{300}, Dims{}},
      // few outputs, long reductions over outer axes: the per-columns schedule (partial blocks of 32 outputs, a
      // kept axis between reduced ones), and row chunks where the reduced axes lead (a last chunk shorter, a
      // last column tile partial, axes of extent 1 among them)
      {Shape{70, 3, 45}, Dims{0, 1}}, {Shape{64, 40}, Dims{0}}, {Shape{5, 130, 33}, Dims{1}}, {Shape{4096, 97}, Dims{0}},
      {Shape{300, 1, 2, 50}, Dims{0}}, {Shape{2, 1000, 1, 7}, Dims{0, 1}}};
  for (auto &[xs, axes] : cases) {
    Shape ys = xs; for (int i = 0; i < axes.size; ++i) ys.v[axes.v[i]] = 1;
    if (axes.size == 0) for (int a = 0; a < xs.size; ++a) ys.v[a] = 1;
    auto x = randv(xs.numel());
    std::vector<float> c(ys.numel()), g(ys.numel());
    ctx = "reduceMean2 " + xs.str() + axes.str();
    pk::reduceMean(x.data(), xs, axes, c.data());
    pc::reduceMean(x.data(), xs, axes, g.data());
    cmp(c, g, 1e-6, "y");
  }
}

static void testReduce() {
  for (int it = 0; it < 60; ++it) {
    int rank = (int)ri(0, 4);
    Shape xs = randShape(rank, it % 3 == 0 ? 40 : 6);
    if (it % 7 == 0 && rank) xs.v[ri(0, rank - 1)] = 1;
    Dims axes;
    for (int a = 0; a < rank; ++a) if (ri(0, 1)) axes.push(a);
    Shape ys;
    for (int a = 0; a < rank; ++a) { bool r = false; for (int i = 0; i < axes.size; ++i) r |= axes.v[i] == a; ys.push(r ? 1 : xs.v[a]); }
    auto x = randv(xs.numel());
    std::vector<float> c(ys.numel()), g(ys.numel());
    ctx = "reduceSum " + xs.str() + axes.str();
    pk::reduceSum(x.data(), xs, axes, c.data());
    pc::reduceSum(x.data(), xs, axes, g.data());
    cmp(c, g, 1e-6, "y");
    // Added into a gradient buffer: the separate sum's bits, added (CPU
    // exactly; CUDA within its summation order).
    {
      auto into = randv(ys.numel()), intoC = into, intoG = into;
      pk::reduceSum(x.data(), xs, axes, intoC.data(), pk::Workspace{}, true);
      pc::reduceSum(x.data(), xs, axes, intoG.data(), true);
      for (size_t i = 0; i < into.size(); ++i) into[i] += c[i];
      cmp(into, intoC, 0, "y accumulated (CPU)");
      cmp(intoC, intoG, 1e-6, "y accumulated");
    }
    Shape ms = ys;
    if (axes.size == 0) for (int a = 0; a < rank; ++a) ms.v[a] = 1;
    std::vector<float> mc(ms.numel()), mg(ms.numel());
    ctx = "reduceMean " + xs.str() + axes.str();
    pk::reduceMean(x.data(), xs, axes, mc.data());
    pc::reduceMean(x.data(), xs, axes, mg.data());
    cmp(mc, mg, 1e-6, "y");
  }
}

static void testSoftmax() {
  std::vector<Shape> shapes = {Shape{4, 7}, Shape{3, 600}, Shape{2, 5, 3}, Shape{3, 1100, 2}, Shape{2, 3, 4, 5}, Shape{2100, 3}, Shape{5, 3, 1000}, Shape{1, 1}};
  for (auto &xs : shapes)
    for (int axis = -xs.size; axis < xs.size; ++axis) {
      auto x = randv(xs.numel(), -5, 5), dy = randv(xs.numel());
      std::vector<float> c(xs.numel()), g(xs.numel()), dc(xs.numel()), dg(xs.numel());
      ctx = "softmax " + xs.str() + " axis " + std::to_string(axis);
      pk::softmax(x.data(), xs, axis, c.data());
      pc::softmax(x.data(), xs, axis, g.data());
      cmp(c, g, 1e-6, "y");
      pk::softmaxGrad(dy.data(), c.data(), xs, axis, dc.data());
      pc::softmaxGrad(dy.data(), c.data(), xs, axis, dg.data());
      cmp(dc, dg, 1e-5, "dx");
    }
  // nn.masked_softmax(_grad): masks broadcast from random shapes, fills
  // -inf (fully masked rows give NaN on both sides) or finite.
  for (auto &xs : shapes)
    for (int variant = 0; variant < 4; ++variant) {
      const Shape ms = bcastOf(xs);
      std::vector<uint8_t> mask(ms.numel());
      for (auto &m : mask) m = (uint8_t)(ri(0, 3) == 0);
      const float scale = variant % 2 ? 8.0f : 0.125f, fill = variant < 2 ? -INFINITY : -1.0e4f;
      const bool divide = variant % 2, maskedWhen = variant != 1;
      auto x = randv(xs.numel(), -5, 5), dy = randv(xs.numel());
      std::vector<float> c(xs.numel()), g(xs.numel()), dc(xs.numel()), dg(xs.numel());
      ctx = "maskedSoftmax " + xs.str() + " mask " + ms.str() + " variant " + std::to_string(variant);
      pk::maskedSoftmax(x.data(), xs, mask.data(), ms, scale, divide, fill, maskedWhen, c.data());
      pc::maskedSoftmax(x.data(), xs, mask.data(), ms, scale, divide, fill, maskedWhen, g.data());
      cmp(c, g, 1e-6, "y");
      pk::maskedSoftmaxGrad(dy.data(), c.data(), xs, mask.data(), ms, scale, divide, maskedWhen, dc.data());
      pc::maskedSoftmaxGrad(dy.data(), c.data(), xs, mask.data(), ms, scale, divide, maskedWhen, dg.data());
      cmp(dc, dg, 1e-5, "dx");
    }
  {
    ctx = "maskedSoftmax mask not broadcasting";
    std::vector<float> x(6), y(6);
    std::vector<uint8_t> mask(3);
    ++checks;
    if (!throws([&] { pc::maskedSoftmax(x.data(), Shape{2, 3}, mask.data(), Shape{3, 1}, 1, false, 0, true, y.data()); })) {
      std::printf("FAIL %s: no error\n", ctx.c_str());
      ++failures;
    }
  }
  std::vector<Shape> ls = {Shape{8, 5},       Shape{3, 700},       Shape{2, 4, 3}, Shape{3, 4, 700},
                           Shape{2, 3, 2, 2}, Shape{0, 3}, Shape{5, 1001}};
  for (auto &ss : ls)
    for (int red = 0; red < 3; ++red)
      for (int variant = 0; variant < 4; ++variant) {
        const int64_t C = ss.v[1];
        Shape lshape{ss.v[0]};
        for (int a = 2; a < ss.size; ++a) lshape.push(ss.v[a]);
        auto s = randv(ss.numel(), -4, 4);
        std::vector<int64_t> lab(lshape.numel());
        for (auto &l : lab) l = ri(0, C - 1);
        std::optional<int64_t> ign;
        if (variant & 1) { ign = 1; for (auto &l : lab) if (ri(0, 2) == 0) l = 1; }
        std::vector<float> w;
        if (variant & 2) w = randv(C, 0.1f, 2);
        const float *wp = w.empty() ? nullptr : w.data();
        const int64_t ln = red == 0 ? lshape.numel() : 1;
        std::vector<float> lc(ln), lg(ln), pc_(ss.numel()), pg(ss.numel());
        ctx = "sce " + ss.str() + " red " + std::to_string(red) + " var " + std::to_string(variant);
        pk::softmaxCrossEntropyLoss(s.data(), ss, lab.data(), wp, (pk::Reduction)red, ign, lc.data(), pc_.data());
        pc::softmaxCrossEntropyLoss(s.data(), ss, lab.data(), wp, (pk::Reduction)red, ign, lg.data(), pg.data());
        cmp(lc, lg, 1e-5, "loss");
        cmp(pc_, pg, 1e-6, "logprob");
        auto dl = randv(ln);
        std::vector<float> dc(ss.numel()), dg(ss.numel());
        pk::softmaxCrossEntropyLossGrad(dl.data(), s.data(), ss, lab.data(), wp, (pk::Reduction)red, ign, dc.data());
        pc::softmaxCrossEntropyLossGrad(dl.data(), s.data(), ss, lab.data(), wp, (pk::Reduction)red, ign, dg.data());
        cmp(dc, dg, 1e-5, "dscores");
      }
}

/// nn.batch_norm (running statistics written apart and in place), its input
/// and parameter gradients, CUDA against CPU; dscale within `dscaleTolerance`.
static void compareBatchNorm(const Shape &xs, const std::vector<float> &x, const std::vector<float> &sc,
                             const std::vector<float> &bi, const std::vector<float> &rm, const std::vector<float> &rv,
                             const std::vector<float> &dy, bool training, double dscaleTolerance) {
  const int64_t C = xs.v[1];
  std::vector<float> yc(xs.numel()), yg(xs.numel()), nmc(C), nvc(C), nmg(C), nvg(C);
  pk::batchNorm(x.data(), xs, sc.data(), bi.data(), rm.data(), rv.data(), yc.data(), nmc.data(), nvc.data(), 1e-5f, 0.9f, training);
  pc::batchNorm(x.data(), xs, sc.data(), bi.data(), rm.data(), rv.data(), yg.data(), nmg.data(), nvg.data(), 1e-5f, 0.9f, training);
  cmp(yc, yg, 1e-5, "y");
  cmp(nmc, nmg, 1e-6, "mean");
  cmp(nvc, nvg, 1e-6, "var");
  // in-place running stats
  auto rm2 = rm, rv2 = rv;
  pc::batchNorm(x.data(), xs, sc.data(), bi.data(), rm2.data(), rv2.data(), yg.data(), rm2.data(), rv2.data(), 1e-5f, 0.9f, training);
  cmp(nmc, rm2, 1e-6, "mean inplace");
  cmp(nvc, rv2, 1e-6, "var inplace");
  std::vector<float> dc(xs.numel()), dg(xs.numel());
  pk::batchNormGrad(dy.data(), x.data(), xs, sc.data(), rm.data(), rv.data(), dc.data(), 1e-5f, training);
  pc::batchNormGrad(dy.data(), x.data(), xs, sc.data(), rm.data(), rv.data(), dg.data(), 1e-5f, training);
  cmp(dc, dg, 1e-4, "dx");
  std::vector<float> dsc(C), dbc(C), dsg(C), dbg(C);
  pk::batchNormParamGrad(dy.data(), x.data(), xs, rm.data(), rv.data(), dsc.data(), dbc.data(), 1e-5f, training);
  pc::batchNormParamGrad(dy.data(), x.data(), xs, rm.data(), rv.data(), dsg.data(), dbg.data(), 1e-5f, training);
  cmp(dsc, dsg, dscaleTolerance, "dscale");
  cmp(dbc, dbg, 1e-5, "dbias");
  // Added into gradient buffers that hold something already.
  auto dsc2 = sc, dbc2 = bi, dsg2 = sc, dbg2 = bi;
  pk::batchNormParamGrad(dy.data(), x.data(), xs, rm.data(), rv.data(), dsc2.data(), dbc2.data(), 1e-5f, training, true);
  pc::batchNormParamGrad(dy.data(), x.data(), xs, rm.data(), rv.data(), dsg2.data(), dbg2.data(), 1e-5f, training, true);
  cmp(dsc2, dsg2, dscaleTolerance, "dscale accumulated");
  cmp(dbc2, dbg2, 1e-5, "dbias accumulated");
}

/// n values drawn uniformly from [lo, hi) by `rng` (a test's own generator,
/// so that the other tests' inputs stay as they were).
static std::vector<float> uniformValues(std::mt19937_64 &rng, int64_t n, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v((size_t)n);
  for (auto &x : v) x = d(rng);
  return v;
}

// Batch norm over channels of several chunks (plan::cudaBatchNormChunks: a
// block per (channel, chunk), the last chunk short), training and
// inference, one channel's mean far from 0 (the shifted sums), running
// statistics updated in place, against the CPU kernels. Its own generator:
// the other cases' inputs stay as they were.
static void testBatchNormChunks() {
  std::mt19937_64 local(91);
  auto values = [&](int64_t n, float lo, float hi) { return uniformValues(local, n, lo, hi); };
  for (const Shape &xs : {Shape{2, 3, 61, 100}, Shape{1, 2, 20000}, Shape{5, 1, 3000}}) {
    const int64_t C = xs.v[1], inner = xs.numel() / (xs.v[0] * C);
    auto x = values(xs.numel(), -2, 2), sc = values(C, -2, 2), bi = values(C, -2, 2), rm = values(C, -1, 1),
         rv = values(C, 0.5f, 2), dy = values(xs.numel(), -2, 2);
    for (int64_t n = 0; n < xs.v[0]; ++n) // channel 0 centred at 100
      for (int64_t i = 0; i < inner; ++i) x[(size_t)(n * C * inner + i)] += 100.0f;
    for (int training = 0; training < 2; ++training) {
      ctx = "batchNorm chunks " + xs.str() + " training " + std::to_string(training);
      compareBatchNorm(xs, x, sc, bi, rm, rv, dy, training, 1e-4);
    }
  }
}

static void testNorm() {
  std::vector<Shape> shapes = {Shape{2, 3}, Shape{4, 3, 5}, Shape{2, 5, 3, 4}, Shape{3, 2, 700}, Shape{1, 4, 1, 1}};
  for (auto &xs : shapes)
    for (int training = 0; training < 2; ++training) {
      const int64_t C = xs.v[1];
      auto x = randv(xs.numel()), sc = randv(C), bi = randv(C), rm = randv(C), rv = randv(C, 0.5, 2), dy = randv(xs.numel());
      ctx = "batchNorm " + xs.str() + " training " + std::to_string(training);
      compareBatchNorm(xs, x, sc, bi, rm, rv, dy, training, 1e-5);
    }
  // Shape{2, 9000}: rows wider than a warp takes (kWarpRowMaxElements), a block per row; Shape{600, 7}
  // along axis 1: 600 rows in 24 chunks of the parameter gradient. Rows of 700, 9000, 768 and 40 move
  // in 16-byte packs (4 floats), 768 in 6 tiles of the parameter gradient's columns, 40 in a part of one.
  std::vector<Shape> lshapes = {Shape{4, 6},       Shape{2, 3, 5}, Shape{3, 700},  Shape{50, 4, 3}, Shape{7},
                                Shape{2, 9000},    Shape{600, 7},  Shape{9, 768},  Shape{300, 40}};
  for (auto &xs : lshapes)
    for (int axis = -xs.size; axis < xs.size; ++axis) {
      const int a = axis < 0 ? axis + xs.size : axis;
      Shape ns(xs.v + a, xs.size - a);
      for (int pv = 0; pv < 3; ++pv)
      for (const pk::RowNorm norm : {pk::RowNorm::Layer, pk::RowNorm::Rms}) {
        Shape ps = pv == 0 ? ns : bcastOf(ns);
        auto x = randv(xs.numel()), g = randv(ps.numel()), b = randv(ps.numel()), dy = randv(xs.numel());
        const int64_t rows = pk::Shape(xs.v, a).numel();
        std::vector<float> yc(xs.numel()), yg(xs.numel()), mc(rows), mg(rows), ic(rows), ig(rows);
        ctx = "layerNorm " + xs.str() + " axis " + std::to_string(axis) + " ps " + ps.str() +
              (norm == pk::RowNorm::Rms ? " (RMS)" : "");
        pk::layerNorm(x.data(), xs, g.data(), ps, b.data(), ps, yc.data(), mc.data(), ic.data(), axis, 1e-5f, norm);
        pc::layerNorm(x.data(), xs, g.data(), ps, b.data(), ps, yg.data(), mg.data(), ig.data(), axis, 1e-5f, norm);
        cmp(yc, yg, 1e-4, "y");
        cmp(mc, mg, 1e-5, "mean");
        cmp(ic, ig, 1e-4, "invstd");
        std::vector<float> dc(xs.numel()), dg(xs.numel());
        pk::layerNormGrad(dy.data(), x.data(), xs, g.data(), ps, dc.data(), axis, 1e-5f, norm);
        pc::layerNormGrad(dy.data(), x.data(), xs, g.data(), ps, dg.data(), axis, 1e-5f, norm);
        cmp(dc, dg, 1e-3, "dx");
        std::vector<float> dsc(ps.numel()), dbc(ps.numel()), dsg(ps.numel()), dbg(ps.numel());
        pk::layerNormParamGrad(dy.data(), x.data(), xs, ps, dsc.data(), dbc.data(), axis, 1e-5f, norm);
        pc::layerNormParamGrad(dy.data(), x.data(), xs, ps, dsg.data(), dbg.data(), axis, 1e-5f, norm);
        cmp(dsc, dsg, 1e-4, "dscale");
        cmp(dbc, dbg, 1e-4, "dbias");
        // Added into gradient buffers (CPU: exactly the separate sums, added).
        auto gsc = randv(ps.numel()), gbc = randv(ps.numel()), gsg = gsc, gbg = gbc, wantS = gsc, wantB = gbc;
        pk::layerNormParamGrad(dy.data(), x.data(), xs, ps, gsc.data(), gbc.data(), axis, 1e-5f, norm,
                               pk::Workspace{}, true);
        pc::layerNormParamGrad(dy.data(), x.data(), xs, ps, gsg.data(), gbg.data(), axis, 1e-5f, norm,
                               pk::Workspace{}, true);
        for (int64_t i = 0; i < ps.numel(); ++i) wantS[i] += dsc[i], wantB[i] += dbc[i];
        cmp(wantS, gsc, 0, "dscale accumulated (CPU)");
        cmp(wantB, gbc, 0, "dbias accumulated (CPU)");
        cmp(gsc, gsg, 1e-4, "dscale accumulated");
        cmp(gbc, gbg, 1e-4, "dbias accumulated");
      }
    }
}

static void testRotary() {
  // Rows of 8 and 16 floats move in packs of 4 (interleaved, or halves of whole packs): tables per
  // position and column, broadcast along the rows, a scalar.
  const std::pair<Shape, Shape> cases[] = {{Shape{2, 3, 5, 8}, Shape{1, 1, 5, 8}}, {Shape{2, 6, 4}, Shape{2, 6, 4}},
                                           {Shape{3, 10}, Shape{1}},           {Shape{2, 4, 6}, Shape{4, 1}},
                                           {Shape{2, 5, 3, 16}, Shape{1, 5, 1, 16}}, {Shape{2, 4, 8}, Shape{4, 1}},
                                           {Shape{3, 16}, Shape{1}}};
  for (const auto &[xs, ts] : cases)
    for (bool interleaved : {false, true})
      for (bool transposed : {false, true}) {
        ctx = "rotary " + xs.str() + " tables " + ts.str() + (interleaved ? " interleaved" : "") +
              (transposed ? " transposed" : "");
        auto x = randv(xs.numel()), c = randv(ts.numel()), s = randv(ts.numel());
        std::vector<float> yc(xs.numel()), yg(xs.numel());
        pk::rotary(x.data(), xs, c.data(), ts, s.data(), ts, yc.data(), interleaved, transposed);
        pc::rotary(x.data(), xs, c.data(), ts, s.data(), ts, yg.data(), interleaved, transposed);
        cmp(yc, yg, 0, "y");
      }
}

static void testAttention() {
  struct Case { Shape qs, ks, vs, ms; bool masked, divide, additive; };
  const Case cases[] = {{Shape{2, 3, 5, 4}, Shape{2, 3, 6, 4}, Shape{2, 3, 6, 3}, Shape{1, 1, 5, 6}, true, false, false},
                        {Shape{2, 70, 4}, Shape{2, 9, 4}, Shape{2, 9, 5}, Shape{70, 9}, true, true, false},
                        {Shape{3, 4, 2}, Shape{3, 7, 2}, Shape{3, 7, 2}, Shape{}, false, false, false},
                        {Shape{2, 70, 4}, Shape{2, 9, 4}, Shape{2, 9, 5}, Shape{2, 1, 9}, true, false, true}};
  // Each case without and with a dropout of P (the CPU's mask, regenerated
  // in the softmax and score-gradient kernels).
  const uint64_t key = pk::dropoutStreamKey(11, 5, 3, pk::dropoutOpId("attn_dropout"));
  // The forward's CUDA call reads the key from (emulated) device memory, as
  // generated stages pass it; the rest pass the key itself.
  const uint64_t callKey = pk::dropoutCallKey(11, 5, 3);
  const pc::StreamKey deviceKey(&callKey, pk::dropoutOpId("attn_dropout"));
  for (const Case &c : cases)
    for (float ratio : {0.0f, 0.3f}) {
      ctx = "attention q " + c.qs.str() + " k " + c.ks.str() + " v " + c.vs.str() + (c.masked ? " masked" : "") +
            (ratio > 0 ? " dropout" : "");
      auto q = randv(c.qs.numel()), k = randv(c.ks.numel()), v = randv(c.vs.numel());
      std::vector<uint8_t> mask(c.ms.numel());
      for (size_t e = 0; e < mask.size(); ++e) mask[e] = e % 3 == 2;
      const auto bias = randv(c.ms.numel());
      const uint8_t *m = c.masked && !c.additive ? mask.data() : nullptr;
      const float *a = c.masked && c.additive ? bias.data() : nullptr;
      const int64_t rows = c.qs.numel() / c.qs.v[c.qs.size - 1], out = rows * c.vs.v[c.vs.size - 1];
      std::vector<float> yc(out), yg(out), lc(rows), lg(rows);
      pk::attention(q.data(), c.qs, k.data(), c.ks, v.data(), c.vs, m, a, c.ms, 0.5f, c.divide, -1e9f, true, ratio, true,
                    key, yc.data(), lc.data());
      pc::attention(q.data(), c.qs, k.data(), c.ks, v.data(), c.vs, m, a, c.ms, 0.5f, c.divide, -1e9f, true, ratio, true,
                    deviceKey, yg.data(), lg.data());
      cmp(yc, yg, 1e-5, "y");
      cmp(lc, lg, 1e-5, "lse");
      if (ratio > 0) { // with v the identity, y is the dropped P: the same zeros
        Shape is = c.vs;
        const int64_t T = c.ks.v[c.ks.size - 2];
        is.v[is.size - 1] = T;
        std::vector<float> identity(is.numel()), pc1(rows * T), pg1(rows * T), l(rows);
        for (int64_t e = 0; e < is.numel(); ++e) identity[e] = (e / T) % T == e % T ? 1.0f : 0.0f;
        pk::attention(q.data(), c.qs, k.data(), c.ks, identity.data(), is, m, a, c.ms, 0.5f, c.divide, -1e9f, true,
                      ratio, true, key, pc1.data(), l.data());
        pc::attention(q.data(), c.qs, k.data(), c.ks, identity.data(), is, m, a, c.ms, 0.5f, c.divide, -1e9f, true,
                      ratio, true, key, pg1.data(), l.data());
        std::vector<uint8_t> zerosC(pc1.size()), zerosG(pg1.size());
        for (size_t e = 0; e < pc1.size(); ++e) zerosC[e] = pc1[e] == 0.0f, zerosG[e] = pg1[e] == 0.0f;
        cmp(zerosC, zerosG, 0, "dropped elements");
      }
      auto dy = randv(out);
      std::vector<float> dqc(q.size()), dkc(k.size()), dvc(v.size()), dqg(q.size()), dkg(k.size()), dvg(v.size());
      pk::attentionGrad(dy.data(), q.data(), c.qs, k.data(), c.ks, v.data(), c.vs, m, a, c.ms, yc.data(), lc.data(), 0.5f,
                        c.divide, -1e9f, true, ratio, true, key, dqc.data(), dkc.data(), dvc.data());
      pc::attentionGrad(dy.data(), q.data(), c.qs, k.data(), c.ks, v.data(), c.vs, m, a, c.ms, yc.data(), lc.data(), 0.5f,
                        c.divide, -1e9f, true, ratio, true, deviceKey, dqg.data(), dkg.data(), dvg.data());
      cmp(dqc, dqg, 1e-4, "dq");
      cmp(dkc, dkg, 1e-4, "dk");
      cmp(dvc, dvg, 1e-4, "dv");
    }
}

static void testLinalg() {
  for (int it = 0; it < 40; ++it) {
    int64_t M = ri(1, 6), N = ri(1, 6), K = ri(it % 10 == 0 ? 0 : 1, 6);
    bool ta = ri(0, 1), tb = ri(0, 1);
    auto A = randv(M * K), B = randv(K * N);
    Shape ys{M, N};
    Shape cs = bcastOf(ys);
    auto C = randv(cs.numel());
    float alpha = 0.7f, beta = ri(0, 1) ? 0.0f : 1.3f;
    bool useC = ri(0, 1);
    std::vector<float> yc(M * N), yg(M * N, NAN);
    ctx = "gemm M" + std::to_string(M) + " N" + std::to_string(N) + " K" + std::to_string(K) + " ta" + std::to_string(ta) + " tb" + std::to_string(tb);
    pk::gemm(A.data(), B.data(), useC ? C.data() : nullptr, cs, yc.data(), M, N, K, ta, tb, alpha, beta);
    pc::gemm(A.data(), B.data(), useC ? C.data() : nullptr, cs, yg.data(), M, N, K, ta, tb, alpha, beta);
    cmp(yc, yg, 1e-5, "y");
  }
  // nn.gemm's epilogue: every activation, with no C, a bias ([N] or [1, N],
  // beta 1: cuBLASLt's bias epilogue) or another C (the cuBLAS path), at
  // offsets that take the pointers off cuBLASLt's default 256-byte alignment.
  const pk::Unary activations[] = {pk::Unary::Relu, pk::Unary::GeluTanh, pk::Unary::Tanh, pk::Unary::Sigmoid,
                                   pk::Unary::Gelu};
  const int ltBefore = emu::ltMatmulCalls;
  for (int it = 0; it < 60; ++it) {
    const int64_t M = ri(1, 7), N = ri(1, 7), K = ri(it % 15 == 0 ? 0 : 1, 7);
    const bool ta = ri(0, 1), tb = ri(0, 1);
    const std::optional<pk::Unary> activation =
        it % 6 == 5 ? std::nullopt : std::optional<pk::Unary>(activations[it % 5]);
    const int cKind = (int)ri(0, 3); // none, [N], [1, N], another broadcast shape
    const Shape cs = cKind == 1 ? Shape{N} : cKind == 2 ? Shape{1, N} : bcastOf(Shape{M, N});
    const float beta = cKind == 3 && ri(0, 1) ? 0.5f : 1.0f;
    const int64_t offset = ri(0, 3); // in floats
    std::vector<float> A = randv(M * K + offset), B = randv(K * N + offset), C = randv(cs.numel() + offset);
    std::vector<float> yc(M * N), yg(M * N + offset, NAN);
    const float *c = cKind == 0 ? nullptr : C.data() + offset;
    ctx = "gemm epilogue " + std::string(activation ? pipec::unaryName(*activation) : "none") + " M" +
          std::to_string(M) + " N" + std::to_string(N) + " K" + std::to_string(K) + " C" + cs.str() +
          (cKind ? "" : "(none)") + " ta" + std::to_string(ta) + " tb" + std::to_string(tb);
    pk::gemm(A.data() + offset, B.data() + offset, c, cs, yc.data(), M, N, K, ta, tb, 0.7f, beta, activation);
    pc::gemm(A.data() + offset, B.data() + offset, c, cs, yg.data() + offset, M, N, K, ta, tb, 0.7f, beta,
             activation);
    cmp(yc, std::vector<float>(yg.begin() + offset, yg.end()), 1e-5, "y");
  }
  ++checks;
  if (emu::ltMatmulCalls - ltBefore < 20) { // the epilogue path must be the one tested
    std::printf("FAIL gemm epilogue: only %d cuBLASLt matmuls\n", emu::ltMatmulCalls - ltBefore);
    ++failures;
  }
  // The same epilogue GEMM again with other operands and another bias: its
  // descriptors and algorithm are reused (no heuristic call after the
  // first), and the bias of each call is the one applied.
  {
    const int64_t M = 5, N = 6, K = 4;
    int heuristicsBefore = 0;
    // 256-byte aligned operands: the alignments are part of what is planned.
    auto aligned = [](std::vector<float> &storage, const std::vector<float> &values) {
      storage.assign(values.size() + 64, NAN);
      float *p = storage.data();
      while (reinterpret_cast<uintptr_t>(p) % 256) ++p;
      std::copy(values.begin(), values.end(), p);
      return p;
    };
    for (int call = 0; call < 3; ++call) {
      std::vector<float> A = randv(M * K), B = randv(K * N), bias = randv(N), yc(M * N);
      std::vector<float> aStore, bStore, yStore;
      float *a = aligned(aStore, A), *b = aligned(bStore, B), *y = aligned(yStore, std::vector<float>(M * N, NAN));
      ctx = "gemm epilogue reused, call " + std::to_string(call);
      if (call == 1) heuristicsBefore = emu::ltHeuristicCalls;
      pk::gemm(A.data(), B.data(), bias.data(), Shape{N}, yc.data(), M, N, K, false, true, 1.0f, 1.0f,
               pk::Unary::Relu);
      pc::gemm(a, b, bias.data(), Shape{N}, y, M, N, K, false, true, 1.0f, 1.0f, pk::Unary::Relu);
      cmp(yc, std::vector<float>(y, y + M * N), 1e-5, "y");
    }
    ++checks;
    if (emu::ltHeuristicCalls != heuristicsBefore) {
      std::printf("FAIL gemm epilogue: %d cuBLASLt heuristic calls for a shape already planned\n",
                  emu::ltHeuristicCalls - heuristicsBefore);
      ++failures;
    }
  }
  std::vector<std::pair<Shape, Shape>> mm = {
      {Shape{3, 4}, Shape{4, 5}}, {Shape{4}, Shape{4, 5}}, {Shape{3, 4}, Shape{4}}, {Shape{4}, Shape{4}},
      {Shape{2, 3, 4}, Shape{4, 5}}, {Shape{2, 3, 4}, Shape{2, 4, 5}}, {Shape{3, 4}, Shape{2, 4, 5}},
      {Shape{2, 1, 3, 4}, Shape{3, 4, 5}}, {Shape{1, 2, 3, 4}, Shape{2, 1, 4, 5}}, {Shape{2, 3, 0}, Shape{0, 5}},
      {Shape{4}, Shape{2, 4, 5}}, {Shape{2, 3, 4}, Shape{4}}, {Shape{3, 2, 3, 4}, Shape{1, 4, 5}}};
  for (auto &[as, bs] : mm) {
    Shape ys = pk::matmulShape(as, bs);
    auto A = randv(as.numel()), B = randv(bs.numel());
    std::vector<float> yc(ys.numel()), yg(ys.numel(), NAN);
    ctx = "matmul " + as.str() + bs.str();
    pk::matmul(A.data(), as, B.data(), bs, yc.data());
    pc::matmul(A.data(), as, B.data(), bs, yg.data());
    cmp(yc, yg, 1e-5, "y");
  }
  // nn.batched_gemm: the trans flags on every path (one GEMM over folded
  // rows, strided-batched, per-entry broadcast).
  struct Trans { Shape as, bs; bool ta, tb; };
  std::vector<Trans> bg = {{Shape{2, 3, 4}, Shape{5, 4}, false, true},      {Shape{2, 4, 3}, Shape{4, 5}, true, false},
                           {Shape{2, 4, 3}, Shape{2, 5, 4}, true, true},    {Shape{2, 1, 4, 3}, Shape{3, 4, 5}, true, false},
                           {Shape{1, 2, 3, 4}, Shape{2, 1, 5, 4}, false, true}, {Shape{3, 4}, Shape{2, 5, 4}, false, true}};
  for (auto &c : bg) {
    Shape ys = pk::matmulShape(pk::gemmOperandShape(c.as, c.ta), pk::gemmOperandShape(c.bs, c.tb));
    auto A = randv(c.as.numel()), B = randv(c.bs.numel());
    std::vector<float> yc(ys.numel()), yg(ys.numel(), NAN);
    ctx = "batched_gemm " + c.as.str() + (c.ta ? "^T" : "") + c.bs.str() + (c.tb ? "^T" : "");
    pk::matmul(A.data(), c.as, B.data(), c.bs, yc.data(), c.ta, c.tb);
    pc::matmul(A.data(), c.as, B.data(), c.bs, yg.data(), c.ta, c.tb);
    cmp(yc, yg, 1e-5, "y");
  }
}

static void testConv() {
  struct Case { Shape xs, ws; Dims s, p, d; int64_t g; };
  std::vector<Case> cases = {
      {Shape{2, 3, 7}, Shape{4, 3, 3}, Dims{1}, Dims{1, 1}, Dims{1}, 1},
      {Shape{2, 4, 9}, Shape{6, 2, 3}, Dims{2}, Dims{0, 2}, Dims{2}, 2},
      {Shape{2, 3, 6, 5}, Shape{4, 3, 3, 2}, Dims{1, 2}, Dims{1, 0, 2, 1}, Dims{1, 1}, 1},
      {Shape{3, 4, 5, 5}, Shape{4, 1, 3, 3}, Dims{2, 1}, Dims{1, 1, 1, 1}, Dims{2, 1}, 4},
      {Shape{2, 4, 5, 5}, Shape{6, 4, 1, 1}, Dims{1, 1}, Dims{0, 0, 0, 0}, Dims{1, 1}, 1},
      {Shape{2, 4, 5, 5}, Shape{6, 2, 1, 1}, Dims{1, 1}, Dims{0, 0, 0, 0}, Dims{1, 1}, 2},
      {Shape{1, 2, 4, 3, 5}, Shape{2, 2, 2, 2, 3}, Dims{1, 2, 1}, Dims{0, 1, 1, 1, 0, 1}, Dims{1, 1, 2}, 1},
      {Shape{5, 6, 4}, Shape{6, 2, 2}, Dims{3}, Dims{2, 2}, Dims{3}, 3},
  };
  for (auto &c : cases) {
    Shape ys = pk::convOutputShape(c.xs, c.ws, c.s, c.p, c.d);
    auto x = randv(c.xs.numel()), w = randv(c.ws.numel()), b = randv(c.ws.v[0]), dy = randv(ys.numel());
    std::vector<float> yc(ys.numel()), yg(ys.numel(), NAN);
    ctx = "conv " + c.xs.str() + c.ws.str();
    pk::conv(x.data(), c.xs, w.data(), c.ws, b.data(), yc.data(), c.s, c.p, c.d, c.g);
    pc::conv(x.data(), c.xs, w.data(), c.ws, b.data(), yg.data(), c.s, c.p, c.d, c.g);
    cmp(yc, yg, 1e-5, "y");
    std::vector<float> dxc(c.xs.numel()), dxg(c.xs.numel(), NAN);
    pk::convInputGrad(dy.data(), ys, w.data(), c.ws, dxc.data(), c.xs, c.s, c.p, c.d, c.g);
    pc::convInputGrad(dy.data(), ys, w.data(), c.ws, dxg.data(), c.xs, c.s, c.p, c.d, c.g);
    cmp(dxc, dxg, 1e-5, "dx");
    std::vector<float> dwc(c.ws.numel()), dwg(c.ws.numel(), NAN);
    pk::convWeightGrad(dy.data(), ys, x.data(), c.xs, dwc.data(), c.ws, c.s, c.p, c.d, c.g);
    pc::convWeightGrad(dy.data(), ys, x.data(), c.xs, dwg.data(), c.ws, c.s, c.p, c.d, c.g);
    cmp(dwc, dwg, 1e-5, "dw");
  }
}

static void testPool() {
  struct Case { Shape xs; Dims k, s, p, d; };
  std::vector<Case> cases = {
      {Shape{2, 3, 7}, Dims{3}, Dims{2}, Dims{1, 1}, Dims{}},
      {Shape{2, 3, 8}, Dims{3}, Dims{2}, Dims{1, 0}, Dims{2}},
      {Shape{1, 2, 6, 7}, Dims{3, 2}, Dims{2, 2}, Dims{1, 0, 1, 1}, Dims{1, 1}},
      {Shape{2, 2, 7, 5}, Dims{2, 3}, Dims{3, 1}, Dims{0, 1, 1, 1}, Dims{2, 1}},
      {Shape{1, 1, 5, 4, 6}, Dims{2, 2, 3}, Dims{2, 1, 2}, Dims{1, 0, 1, 0, 1, 1}, Dims{1, 2, 1}},
      {Shape{2, 2, 4, 4}, Dims{2, 2}, Dims{2, 2}, Dims{0, 0, 0, 0}, Dims{}},
      // 4 spatial axes: the kernels with a run-time axis count (1-3 are unrolled instances, pool.cu).
      {Shape{1, 2, 3, 4, 3, 4}, Dims{2, 2, 2, 2}, Dims{1, 2, 1, 2}, Dims{0, 1, 0, 0, 1, 0, 0, 1}, Dims{1, 1, 2, 1}},
  };
  for (auto &c : cases)
    for (int ceil = 0; ceil < 2; ++ceil) {
      Shape ys = pk::poolOutputShape(c.xs, c.k, c.s, c.p, c.d, ceil);
      auto x = randv(c.xs.numel()), dy = randv(ys.numel());
      // ties for max pool
      for (auto &v : x) if (ri(0, 3) == 0) v = 1.0f;
      std::vector<float> yc(ys.numel()), yg(ys.numel());
      ctx = "maxPool " + c.xs.str() + " ceil " + std::to_string(ceil);
      pk::maxPool(x.data(), c.xs, yc.data(), c.k, c.s, c.p, c.d, ceil);
      pc::maxPool(x.data(), c.xs, yg.data(), c.k, c.s, c.p, c.d, ceil);
      cmp(yc, yg, 0, "y");
      std::vector<float> dc(c.xs.numel()), dg(c.xs.numel(), NAN);
      pk::maxPoolGrad(dy.data(), x.data(), c.xs, dc.data(), c.k, c.s, c.p, c.d, ceil);
      pc::maxPoolGrad(dy.data(), x.data(), c.xs, dg.data(), c.k, c.s, c.p, c.d, ceil);
      cmp(dc, dg, 0, "dx");
      Shape ays = pk::poolOutputShape(c.xs, c.k, c.s, c.p, Dims{}, ceil);
      auto ady = randv(ays.numel());
      for (int cip = 0; cip < 2; ++cip) {
        std::vector<float> ac(ays.numel()), ag(ays.numel());
        ctx = "avgPool " + c.xs.str() + " ceil " + std::to_string(ceil) + " cip " + std::to_string(cip);
        pk::averagePool(x.data(), c.xs, ac.data(), c.k, c.s, c.p, ceil, cip);
        pc::averagePool(x.data(), c.xs, ag.data(), c.k, c.s, c.p, ceil, cip);
        cmp(ac, ag, 0, "y");
        std::vector<float> adc(c.xs.numel()), adg(c.xs.numel(), NAN);
        pk::averagePoolGrad(ady.data(), adc.data(), c.xs, c.k, c.s, c.p, ceil, cip);
        pc::averagePoolGrad(ady.data(), adg.data(), c.xs, c.k, c.s, c.p, ceil, cip);
        cmp(adc, adg, 0, "dx");
      }
    }
  for (auto xs : {Shape{2, 3, 5}, Shape{2, 2, 30, 30}}) {
    auto x = randv(xs.numel());
    std::vector<float> c(xs.v[0] * xs.v[1]), g(xs.v[0] * xs.v[1]);
    ctx = "gap";
    pk::globalAveragePool(x.data(), xs, c.data());
    pc::globalAveragePool(x.data(), xs, g.data());
    cmp(c, g, 1e-6, "y");
  }
}

static void testOptim() {
  for (int step = 1; step <= 3; ++step) {
    int64_t n = 1000;
    auto p = randv(n), gr = randv(n), m = randv(n), v = randv(n, 0, 1), buf = randv(n);
    auto p2 = p, m2 = m, v2 = v, buf2 = buf;
    ctx = "adamw";
    pk::adamwUpdate(p.data(), gr.data(), m.data(), v.data(), n, step, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f);
    pc::adamwUpdate(p2.data(), gr.data(), m2.data(), v2.data(), n, step, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f);
    cmp(p, p2, 0, "p"); cmp(m, m2, 0, "m"); cmp(v, v2, 0, "v");
    ctx = "sgd";
    pk::sgdUpdate(p.data(), gr.data(), buf.data(), n, step, 0.1f, 0.9f, 0.01f);
    pc::sgdUpdate(p2.data(), gr.data(), buf2.data(), n, step, 0.1f, 0.9f, 0.01f);
    cmp(p, p2, 0, "p"); cmp(buf, buf2, 0, "buf");
  }
}

// The stage-wide updates (one launch per 64 tensors) against the CPU
// library's, and both against the single-tensor kernels on gradients scaled
// as the runtime scales them: bit for bit, with every verdict of the
// runtime (none, clipped, skipped) and tensors that cross the CUDA blocks'
// chunk boundaries or are empty.
static void testOptimAll() {
  const int count = 70;
  std::vector<int64_t> sizes((size_t)count);
  for (auto &n : sizes) n = ri(0, 3) == 0 ? ri(0, 9000) : ri(1, 300);
  sizes[3] = 0, sizes[5] = 4096, sizes[6] = 4097;
  struct Side {
    std::vector<std::vector<float>> p, m, v;
    std::vector<pk::OptimizerTensor> table;
  };
  std::vector<std::vector<float>> grads;
  for (int64_t n : sizes) grads.push_back(randv(n));
  auto makeSide = [&](uint64_t seed, bool adamw) {
    rng.seed(seed);
    Side s;
    for (size_t k = 0; k < sizes.size(); ++k) {
      s.p.push_back(randv(sizes[k]));
      s.m.push_back(randv(sizes[k]));
      s.v.push_back(randv(sizes[k], 0, 1));
    }
    for (size_t k = 0; k < sizes.size(); ++k)
      s.table.push_back({s.p[k].data(), grads[k].data(), {s.m[k].data(), adamw ? s.v[k].data() : nullptr}, sizes[k]});
    return s;
  };
  const pipec_step_control clipped{0.375, 0.0}, skipped{1.0, 1.0}, plain{1.0, 0.0};
  const pipec_step_control *verdicts[] = {nullptr, &plain, &clipped, &skipped};
  for (bool adamw : {true, false})
    for (const pipec_step_control *verdict : verdicts)
      for (int step = 1; step <= 2; ++step) {
        ctx = std::string(adamw ? "adamwUpdateAll" : "sgdUpdateAll") + " step " + std::to_string(step) +
              (verdict == &clipped ? " clipped" : verdict == &skipped ? " skipped" : "");
        const uint64_t seed = rng();
        Side cpu = makeSide(seed, adamw), gpu = makeSide(seed, adamw), single = makeSide(seed, adamw);
        const int launchesBefore = emu::launches;
        if (adamw) {
          pk::adamwUpdateAll(cpu.table.data(), count, step, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, verdict);
          pc::adamwUpdateAll(gpu.table.data(), count, step, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, verdict);
        } else {
          pk::sgdUpdateAll(cpu.table.data(), count, step, 0.1f, 0.9f, 0.01f, verdict);
          pc::sgdUpdateAll(gpu.table.data(), count, step, 0.1f, 0.9f, 0.01f, verdict);
        }
        ++checks;
        if (emu::launches - launchesBefore != 2) { // 70 tensors (one empty): two tables of at most 64
          std::printf("FAIL %s: %d launches, expected 2\n", ctx.c_str(), emu::launches - launchesBefore);
          ++failures;
        }
        // The reference: nothing when skipped, else the single-tensor CPU
        // kernel on the gradient the runtime would have scaled in place.
        if (verdict != &skipped)
          for (size_t k = 0; k < sizes.size(); ++k) {
            std::vector<float> g = grads[k];
            if (verdict == &clipped)
              for (float &x : g) x = (float)(x * clipped.grad_scale);
            if (adamw)
              pk::adamwUpdate(single.p[k].data(), g.data(), single.m[k].data(), single.v[k].data(), sizes[k], step,
                              1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f);
            else
              pk::sgdUpdate(single.p[k].data(), g.data(), single.m[k].data(), sizes[k], step, 0.1f, 0.9f, 0.01f);
          }
        for (size_t k = 0; k < sizes.size(); ++k) {
          cmp(cpu.p[k], gpu.p[k], 0, "param");
          cmp(cpu.m[k], gpu.m[k], 0, "state 0");
          cmp(cpu.v[k], gpu.v[k], 0, "state 1");
          cmp(single.p[k], cpu.p[k], 0, "param against the single-tensor kernel");
          cmp(single.m[k], cpu.m[k], 0, "state 0 against the single-tensor kernel");
          cmp(single.v[k], cpu.v[k], 0, "state 1 against the single-tensor kernel");
        }
      }
  // Plain SGD keeps no momentum buffer.
  ctx = "sgdUpdateAll without momentum";
  std::vector<float> p = randv(5000), p2 = p, g = randv(5000);
  pk::OptimizerTensor a{p.data(), g.data(), {nullptr, nullptr}, 5000}, b{p2.data(), g.data(), {nullptr, nullptr}, 5000};
  pk::sgdUpdateAll(&a, 1, 3, 0.1f, 0.0f, 0.0f, nullptr);
  pc::sgdUpdateAll(&b, 1, 3, 0.1f, 0.0f, 0.0f, nullptr);
  cmp(p, p2, 0, "param");
  ++checks;
  if (!throws([&] { pc::sgdUpdateAll(&b, 1, 3, 0.1f, 0.9f, 0.0f, nullptr); }) ||
      !throws([&] { pk::sgdUpdateAll(&a, 1, 3, 0.1f, 0.9f, 0.0f, nullptr); })) {
    std::printf("FAIL %s: momentum without its buffer was accepted\n", ctx.c_str());
    ++failures;
  }
}

static void testMini() {
  Shape xs{4, 7};
  auto x = randv(xs.numel());
  std::vector<float> c(xs.numel()), g(xs.numel());
  ctx = "mini softmax";
  pk::softmax(x.data(), xs, 1, c.data());
  pc::softmax(x.data(), xs, 1, g.data());
  cmp(c, g, 1e-6, "y");
  Shape ls{2, 100};
  auto lx = randv(ls.numel());
  c.assign(ls.numel(), 0); g.assign(ls.numel(), 0);
  std::vector<float> gm(100, 1.0f);
  ctx = "mini layernorm";
  pk::layerNorm(lx.data(), ls, gm.data(), Shape{100}, nullptr, Shape{}, c.data(), nullptr, nullptr, 1, 1e-5f);
  pc::layerNorm(lx.data(), ls, gm.data(), Shape{100}, nullptr, Shape{}, g.data(), nullptr, nullptr, 1, 1e-5f);
  cmp(c, g, 1e-5, "y");
}

/// Concat and split of 11 non-empty pieces: two launches of movement.cu's copyPieces (8 pieces,
/// then 3), with rows that allow 16-byte moves (inner 8) and rows that do not (inner 5).
static void testManyPieces() {
  for (int64_t inner : {int64_t(5), int64_t(8)}) {
    std::vector<Shape> shapes;
    std::vector<std::vector<float>> ins;
    std::vector<const float *> ptrs;
    Dims sizes;
    int64_t total = 0;
    for (int i = 0; i < 11; ++i) {
      shapes.push_back(Shape{3, 1 + i % 3, inner});
      sizes.push(1 + i % 3);
      total += 1 + i % 3;
      ins.push_back(randv(shapes.back().numel()));
    }
    for (auto &v : ins) ptrs.push_back(v.data());
    const Shape whole{3, total, inner};
    std::vector<float> cc(whole.numel()), cg(whole.numel());
    ctx = "concat of 11 pieces, inner " + std::to_string(inner);
    pk::concat(ptrs.data(), shapes.data(), 11, 1, cc.data());
    pc::concat(ptrs.data(), shapes.data(), 11, 1, cg.data());
    cmp(cc, cg, 0, "y");
    std::vector<std::vector<float>> pieces;
    std::vector<float *> outs;
    for (auto &shape : shapes) pieces.emplace_back(shape.numel(), NAN);
    for (auto &piece : pieces) outs.push_back(piece.data());
    ctx = "split into 11 pieces, inner " + std::to_string(inner);
    pc::split(cc.data(), whole, 1, sizes, outs.data());
    for (int i = 0; i < 11; ++i) cmp(ins[i], pieces[i], 0, "piece");
  }
}

static void testLossNotFinite() {
  // Cross-entropy over scores that are not all finite, as the CPU's two passes treat them: -inf
  // (a masked class) first in its row and in the middle adds nothing; a row of nothing but -inf, a
  // +inf and a NaN give NaN.
  Shape ss{5, 40};
  auto s = randv(ss.numel(), -4, 4);
  for (int k = 0; k < 7; ++k) s[k] = -INFINITY;
  for (int k = 10; k < 20; ++k) s[40 + k] = -INFINITY;
  for (int k = 0; k < 40; ++k) s[80 + k] = -INFINITY;
  s[120 + 3] = INFINITY;
  s[160 + 5] = NAN;
  const std::vector<int64_t> labels = {9, 2, 0, 1, 6};
  std::vector<float> lc(5), lg(5), pcs(ss.numel()), pgs(ss.numel()), dc(ss.numel()), dg(ss.numel());
  const std::vector<float> dl(5, 1.0f);
  ctx = "cross-entropy, scores not all finite";
  pk::softmaxCrossEntropyLoss(s.data(), ss, labels.data(), nullptr, pk::Reduction::None, std::nullopt, lc.data(),
                              pcs.data());
  pc::softmaxCrossEntropyLoss(s.data(), ss, labels.data(), nullptr, pk::Reduction::None, std::nullopt, lg.data(),
                              pgs.data());
  cmp(lc, lg, 1e-5, "loss");
  cmp(pcs, pgs, 1e-6, "logprob");
  pk::softmaxCrossEntropyLossGrad(dl.data(), s.data(), ss, labels.data(), nullptr, pk::Reduction::None,
                                  std::nullopt, dc.data());
  pc::softmaxCrossEntropyLossGrad(dl.data(), s.data(), ss, labels.data(), nullptr, pk::Reduction::None,
                                  std::nullopt, dg.data());
  cmp(dc, dg, 1e-5, "dscores");
  if (!std::isfinite(lg[0]) || !std::isfinite(lg[1]) || !std::isnan(lg[2]) || !std::isnan(lg[3]) ||
      !std::isnan(lg[4])) {
    std::printf("FAIL %s: losses %g %g %g %g %g, wanted finite, finite, NaN, NaN, NaN\n", ctx.c_str(), lg[0],
                lg[1], lg[2], lg[3], lg[4]);
    ++failures;
  }
}

static void testEmpty() {
  { Shape as{0, 3}, bs{3}; std::vector<float> a(1), b(3), c(1), g(1);
    ctx = "empty binary"; pk::binary(pk::Binary::Add, a.data(), as, b.data(), bs, c.data()); pc::binary(pk::Binary::Add, a.data(), as, b.data(), bs, g.data()); }
  for (auto axesv : {Dims{1}, Dims{0}, Dims{}}) {
    Shape xs{3, 0, 2}; std::vector<float> x(1);
    Shape ys{3, 1, 2};
    for (int i = 0; i < axesv.size; ++i) ys.v[axesv.v[i]] = 1;
    if (axesv.size == 0) ys = Shape{1, 1, 1};
    std::vector<float> c(ys.numel() ? ys.numel() : 1), g(c.size());
    ctx = "empty reduceMean " + axesv.str();
    pk::reduceMean(x.data(), xs, axesv, c.data()); pc::reduceMean(x.data(), xs, axesv, g.data());
    if (ys.numel()) cmp(c, g, 0, "y");
    std::vector<float> c2(c.size()), g2(c.size());
    ctx = "empty reduceSum " + axesv.str();
    Shape ss = xs; for (int i = 0; i < axesv.size; ++i) ss.v[axesv.v[i]] = 1;
    pk::reduceSum(x.data(), xs, axesv, c2.data()); pc::reduceSum(x.data(), xs, axesv, g2.data());
    if (ss.numel() && ss.numel() <= (int64_t)c2.size()) { c2.resize(ss.numel()); g2.resize(ss.numel()); cmp(c2, g2, 0, "y"); }
  }
  { Shape xs{0, 5}; std::vector<float> x(1), c(1), g(1);
    ctx = "empty softmax"; pk::softmax(x.data(), xs, 1, c.data()); pc::softmax(x.data(), xs, 1, g.data());
    Shape x2{3, 0}; pk::softmax(x.data(), x2, 1, c.data()); pc::softmax(x.data(), x2, 1, g.data()); }
  { Shape xs{0, 3, 4}; std::vector<float> x(1), sc(3, 1), bi(3, 0), rm(3, 0.5), rv(3, 2), y(1), nmc(3), nvc(3), nmg(3), nvg(3);
    ctx = "empty batchNorm";
    pk::batchNorm(x.data(), xs, sc.data(), bi.data(), rm.data(), rv.data(), y.data(), nmc.data(), nvc.data(), 1e-5f, 0.9f, true);
    pc::batchNorm(x.data(), xs, sc.data(), bi.data(), rm.data(), rv.data(), y.data(), nmg.data(), nvg.data(), 1e-5f, 0.9f, true);
    cmp(nmc, nmg, 0, "mean"); cmp(nvc, nvg, 0, "var");
    std::vector<float> dsc(3), dbc(3), dsg(3, 7), dbg(3, 7);
    pk::batchNormParamGrad(x.data(), x.data(), xs, rm.data(), rv.data(), dsc.data(), dbc.data(), 1e-5f, true);
    pc::batchNormParamGrad(x.data(), x.data(), xs, rm.data(), rv.data(), dsg.data(), dbg.data(), 1e-5f, true);
    cmp(dsc, dsg, 0, "dscale"); cmp(dbc, dbg, 0, "dbias"); }
  { Shape xs{0, 4}; std::vector<float> x(1), gm(4, 1), y(1), dsc(4), dbc(4), dsg(4, 7), dbg(4, 7);
    ctx = "empty layerNorm";
    pk::layerNorm(x.data(), xs, gm.data(), Shape{4}, gm.data(), Shape{4}, y.data(), nullptr, nullptr, 1, 1e-5f);
    pc::layerNorm(x.data(), xs, gm.data(), Shape{4}, gm.data(), Shape{4}, y.data(), nullptr, nullptr, 1, 1e-5f);
    pk::layerNormParamGrad(x.data(), x.data(), xs, Shape{4}, dsc.data(), dbc.data(), 1, 1e-5f);
    pc::layerNormParamGrad(x.data(), x.data(), xs, Shape{4}, dsg.data(), dbg.data(), 1, 1e-5f);
    cmp(dsc, dsg, 0, "dscale"); cmp(dbc, dbg, 0, "dbias");
    Shape ps{1}; std::vector<float> a1(1), b1(1), a2(1, 7), b2(1, 7);
    pk::layerNormParamGrad(x.data(), x.data(), xs, ps, a1.data(), b1.data(), 1, 1e-5f);
    pc::layerNormParamGrad(x.data(), x.data(), xs, ps, a2.data(), b2.data(), 1, 1e-5f);
    cmp(a1, a2, 0, "dscale1"); cmp(b1, b2, 0, "dbias1"); }
  { Shape xs{0, 2, 5}, ws{3, 2, 2}; std::vector<float> x(1), w(12), dy(1), dwc(12), dwg(12, 7);
    ctx = "empty conv";
    pk::convWeightGrad(dy.data(), Shape{0, 3, 4}, x.data(), xs, dwc.data(), ws, Dims{1}, Dims{0, 0}, Dims{1}, 1);
    pc::convWeightGrad(dy.data(), Shape{0, 3, 4}, x.data(), xs, dwg.data(), ws, Dims{1}, Dims{0, 0}, Dims{1}, 1);
    cmp(dwc, dwg, 0, "dw"); }
  { Shape xs{2, 0, 5}, ws{3, 0, 2}; std::vector<float> x(1), w(1), b{1, 2, 3}, yc(24), yg(24, 7);
    ctx = "C=0 conv";
    pk::conv(x.data(), xs, w.data(), ws, b.data(), yc.data(), Dims{1}, Dims{0, 0}, Dims{1}, 1);
    pc::conv(x.data(), xs, w.data(), ws, b.data(), yg.data(), Dims{1}, Dims{0, 0}, Dims{1}, 1);
    cmp(yc, yg, 0, "y"); }
  { Shape as{2, 3, 0}, bs{0, 4}; std::vector<float> a(1), b(1), yc(24), yg(24, 7);
    ctx = "K=0 matmul"; pk::matmul(a.data(), as, b.data(), bs, yc.data()); pc::matmul(a.data(), as, b.data(), bs, yg.data()); cmp(yc, yg, 0, "y");
    std::vector<float> C{1, 2, 3, 4}, gc(12), gg(12, 7);
    ctx = "K=0 gemm"; pk::gemm(a.data(), b.data(), C.data(), Shape{4}, gc.data(), 3, 4, 0, false, false, 1.f, 2.f);
    pc::gemm(a.data(), b.data(), C.data(), Shape{4}, gg.data(), 3, 4, 0, false, false, 1.f, 2.f); cmp(gc, gg, 0, "y"); }
  { Shape ss{0, 3}; std::vector<float> s(1), lc(1), lg(1, 7); std::vector<int64_t> lab(1);
    for (int red = 1; red < 3; ++red) {
      ctx = "empty loss " + std::to_string(red);
      pk::softmaxCrossEntropyLoss(s.data(), ss, lab.data(), nullptr, (pk::Reduction)red, std::nullopt, lc.data(), nullptr);
      pc::softmaxCrossEntropyLoss(s.data(), ss, lab.data(), nullptr, (pk::Reduction)red, std::nullopt, lg.data(), nullptr);
      cmp(lc, lg, 0, "loss"); } }
  { // all ignored mean -> NaN; gradient with all ignored
    Shape ss{2, 3}; std::vector<float> s = randv(6), lc(1), lg(1, 7); std::vector<int64_t> lab{1, 1};
    ctx = "all-ignored loss";
    pk::softmaxCrossEntropyLoss(s.data(), ss, lab.data(), nullptr, pk::Reduction::Mean, 1, lc.data(), nullptr);
    pc::softmaxCrossEntropyLoss(s.data(), ss, lab.data(), nullptr, pk::Reduction::Mean, 1, lg.data(), nullptr);
    cmp(lc, lg, 0, "loss");
    std::vector<float> dl{1}, dc(6), dg(6, 7);
    pk::softmaxCrossEntropyLossGrad(dl.data(), s.data(), ss, lab.data(), nullptr, pk::Reduction::Mean, 1, dc.data());
    pc::softmaxCrossEntropyLossGrad(dl.data(), s.data(), ss, lab.data(), nullptr, pk::Reduction::Mean, 1, dg.data());
    cmp(dc, dg, 0, "dscores"); }
  { // device errors
    Shape ds{4, 3}; std::vector<float> d = randv(12), o(6); std::vector<int64_t> idx{1, 9};
    ctx = "gather oob";
    pc::gather(d.data(), ds, idx.data(), Shape{2}, 0, o.data());
    bool got = throws([] { pc::raiseDeviceErrors(); });
    ++checks; if (!got) { ++failures; std::printf("FAIL gather oob not reported\n"); }
    std::vector<int64_t> a{5, 6}, b{1, 0}, r(2);
    pc::binary(pk::Binary::Div, a.data(), Shape{2}, b.data(), Shape{2}, r.data());
    got = throws([] { pc::raiseDeviceErrors(); });
    ++checks; if (!got || r[1] != 0 || r[0] != 5) { ++failures; std::printf("FAIL div0\n"); }
    got = throws([] { pc::raiseDeviceErrors(); });
    ++checks; if (got) { ++failures; std::printf("FAIL flag not reset\n"); }
  }
}

//===----------------------------------------------------------------------===//
// bf16 storage (docs/cuda-kernels.md, "bf16 storage"): each bf16 overload
// against the CPU float kernel run on the same bf16-rounded inputs, its
// result rounded to bf16. Element-wise ops: within 1 bf16 ulp (the device's
// math library may round the float differently; here both are host float,
// so they agree exactly, which the ulp check allows); movement: bit-exact;
// sums into float: the float tolerances (the inputs are exact floats);
// GEMMs, norms, softmaxes, attention: stated per check.
//===----------------------------------------------------------------------===//

using bf = pc::bf16;
static std::vector<bf> toBf(const std::vector<float> &v) {
  std::vector<bf> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = bf(v[i]);
  return r;
}
static std::vector<float> fromBf(const std::vector<bf> &v) {
  std::vector<float> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = (float)v[i];
  return r;
}
static std::vector<float> roundBf(const std::vector<float> &v) { return fromBf(toBf(v)); }
static uint16_t bitsOf(bf x) {
  uint16_t u;
  std::memcpy(&u, &x, 2);
  return u;
}
// Random values already representable in bf16 (the inputs a bf16 stage holds).
static std::vector<float> randbf(int64_t n, float lo = -2, float hi = 2) { return roundBf(randv(n, lo, hi)); }

/// gpu within `ulps` bf16 ulps of the CPU float result rounded to bf16
/// (NaN matches NaN; 0 ulps: the same bits).
static void cmpBf(const std::vector<float> &cpu, const std::vector<bf> &gpu, int ulps, const char *what) {
  ++checks;
  if (cpu.size() != gpu.size()) { std::printf("FAIL %s %s: size\n", ctx.c_str(), what); ++failures; return; }
  for (size_t i = 0; i < cpu.size(); ++i) {
    const bf want = bf(cpu[i]);
    const float w = (float)want, g = (float)gpu[i];
    if (std::isnan(w) && std::isnan(g)) continue;
    // Ordered integer images of the bit patterns: the ulp distance.
    auto ordered = [](uint16_t u) { return (u & 0x8000) ? -(int)(u & 0x7fff) : (int)u; };
    const int d = std::abs(ordered(bitsOf(want)) - ordered(bitsOf(gpu[i])));
    if (std::isnan(w) != std::isnan(g) || d > ulps) {
      std::printf("FAIL %s %s: [%zu] cpu %.9g (bf16 %.9g) gpu %.9g, %d ulps (n=%zu)\n", ctx.c_str(), what, i,
                  cpu[i], w, g, d, cpu.size());
      ++failures;
      return;
    }
  }
}
/// gpu (bf16) against the CPU float result within a relative tolerance.
static void cmpBfTol(const std::vector<float> &cpu, const std::vector<bf> &gpu, double tol, const char *what) {
  cmp(cpu, fromBf(gpu), tol, what);
}

/// gpu (bf16) against the CPU float result within tol · (1 + max |cpu|):
/// for products whose terms the sum may cancel far below their own size
/// (the largest element of the result stands for the terms' magnitude).
static void cmpBfNormwise(const std::vector<float> &cpu, const std::vector<bf> &gpu, double tol, const char *what) {
  double largest = 0;
  for (float a : cpu) largest = std::max(largest, (double)std::fabs(a));
  std::vector<float> g = fromBf(gpu);
  ++checks;
  if (cpu.size() != g.size()) { std::printf("FAIL %s %s: size\n", ctx.c_str(), what); ++failures; return; }
  for (size_t i = 0; i < cpu.size(); ++i)
    if (!(std::fabs((double)cpu[i] - g[i]) <= tol * (1 + largest))) {
      std::printf("FAIL %s %s: [%zu] cpu %.9g gpu %.9g (largest %.9g, n=%zu)\n", ctx.c_str(), what, i, cpu[i], g[i],
                  largest, cpu.size());
      ++failures;
      return;
    }
}

static void testBf16Type() {
  ctx = "bf16 type";
  struct Case { float in; uint16_t bits; };
  const Case cases[] = {{1.0f, 0x3f80}, {-2.0f, 0xc000}, {1.00390625f, 0x3f80} /* tie: even */,
                        {1.01171875f, 0x3f82} /* tie: up to even */, {3.4e38f, 0x7f80} /* overflow */,
                        {INFINITY, 0x7f80}, {-0.0f, 0x8000}, {1e-40f, 0x0001} /* subnormal */};
  for (const Case &c : cases) {
    ++checks;
    if (bitsOf(bf(c.in)) != c.bits) {
      std::printf("FAIL %s: bf16(%g) = 0x%04x, want 0x%04x\n", ctx.c_str(), c.in, bitsOf(bf(c.in)), c.bits);
      ++failures;
    }
  }
  ++checks;
  if (!std::isnan((float)bf(NAN)) || (float)bf(1.5f) != 1.5f || sizeof(bf) != 2) {
    std::printf("FAIL %s: NaN, exact widening or size\n", ctx.c_str());
    ++failures;
  }
  // cast<float, bf16> is bf16(float) element by element; cast<bf16, float> widens exactly.
  std::vector<float> x = randv(1000, -300, 300);
  x[0] = NAN, x[1] = INFINITY, x[2] = -0.0f, x[3] = 1e-40f, x[4] = 3.4e38f;
  std::vector<bf> g(x.size());
  pc::cast(x.data(), (int64_t)x.size(), g.data());
  cmpBf(x, g, 0, "cast float->bf16");
  std::vector<float> back(x.size());
  pc::cast(g.data(), (int64_t)g.size(), back.data());
  cmp(fromBf(g), back, 0, "cast bf16->float");
}

static void testBf16Elementwise() {
  for (int it = 0; it < 30; ++it) {
    Shape os = randShape((int)ri(0, 4), 5);
    Shape as = ri(0, 1) ? os : bcastOf(os), bs = bcastOf(os);
    if (ri(0, 1)) std::swap(as, bs);
    Shape rs = pk::broadcastShape(as, bs);
    auto a = randbf(as.numel(), 0.1f, 2), b = randbf(bs.numel(), -2, 2);
    auto ab = toBf(a), bb = toBf(b);
    for (int op = 0; op < 5; ++op) {
      ctx = "bf16 binary op " + std::to_string(op) + " " + as.str() + bs.str();
      std::vector<float> c(rs.numel());
      std::vector<bf> g(rs.numel());
      pk::binary((pk::Binary)op, a.data(), as, b.data(), bs, c.data());
      pc::binary((pk::Binary)op, ab.data(), as, bb.data(), bs, g.data());
      cmpBf(c, g, 1, "out");
    }
    for (int op = 0; op < 4; ++op) {
      ctx = "bf16 binaryGrad " + std::to_string(op) + as.str() + bs.str();
      auto dy = randbf(rs.numel());
      auto dyb = toBf(dy);
      std::vector<float> c(rs.numel());
      std::vector<bf> g(rs.numel());
      pk::binaryGrad((pk::BinaryGrad)op, dy.data(), a.data(), as, b.data(), bs, c.data());
      pc::binaryGrad((pk::BinaryGrad)op, dyb.data(), ab.data(), as, bb.data(), bs, g.data());
      cmpBf(c, g, 1, "dx");
    }
    { // compare and where: exact
      std::vector<uint8_t> c(rs.numel()), g(rs.numel());
      ctx = "bf16 compare";
      pk::compare(pk::Binary::Less, a.data(), as, b.data(), bs, c.data());
      pc::compare(pk::Binary::Less, ab.data(), as, bb.data(), bs, g.data());
      cmp(c, g, 0, "less");
      Shape cs = bcastOf(rs);
      std::vector<uint8_t> cond(cs.numel());
      for (auto &x : cond) x = (uint8_t)ri(0, 1);
      Shape ws = pk::broadcastShape(cs, rs);
      std::vector<float> wc(ws.numel());
      std::vector<bf> wg(ws.numel());
      ctx = "bf16 where";
      pk::where(cond.data(), cs, a.data(), as, b.data(), bs, wc.data());
      pc::where(cond.data(), cs, ab.data(), as, bb.data(), bs, wg.data());
      cmpBf(wc, wg, 0, "where");
    }
  }
  for (int op = 0; op < pipec::kNumUnaryFunctions; ++op) {
    int64_t n = ri(1, 3000);
    auto x = randbf(n, (pk::Unary)op == pk::Unary::Sqrt ? 0.f : -3.f, 3), dy = randbf(n);
    std::vector<float> c(n), dc(n);
    std::vector<bf> g(n), dg(n);
    ctx = std::string("bf16 unary ") + pipec::kUnaryFunctions[op].spelling;
    auto xb = toBf(x), dyb = toBf(dy);
    pk::unary((pk::Unary)op, x.data(), n, c.data());
    pc::unary((pk::Unary)op, xb.data(), n, g.data());
    cmpBf(c, g, 1, "y");
    // The gradient reads the stored (bf16) forward result.
    auto yr = fromBf(g);
    pk::unaryGrad((pk::Unary)op, dy.data(), x.data(), yr.data(), n, dc.data());
    pc::unaryGrad((pk::Unary)op, dyb.data(), xb.data(), g.data(), n, dg.data());
    cmpBf(dc, dg, 1, "dx");
  }
  for (int t = 0; t < 2; ++t) {
    int64_t n = 5000;
    auto x = randbf(n), dy = randbf(n);
    auto xb = toBf(x), dyb = toBf(dy);
    std::vector<float> c(n), dc(n);
    std::vector<bf> g(n), dg(n);
    std::vector<uint8_t> mc(n), mg(n);
    ctx = "bf16 dropout";
    pk::dropout(x.data(), n, c.data(), mc.data(), 0.3f, t, 777);
    pc::dropout(xb.data(), n, g.data(), mg.data(), 0.3f, t, 777);
    cmpBf(c, g, 1, "y");
    cmp(mc, mg, 0, "mask");
    pk::dropoutGrad(dy.data(), mc.data(), n, dc.data(), 0.3f, t);
    pc::dropoutGrad(dyb.data(), mg.data(), n, dg.data(), 0.3f, t);
    cmpBf(dc, dg, 1, "dx");
    std::vector<bf> rg(n);
    pc::dropoutGradRedrawn(dyb.data(), n, rg.data(), 0.3f, t, 777);
    cmpBf(dc, rg, 1, "dx redrawn");
  }
  // Packs of 8 bf16: rows of 16 and 32 (and of 8, interleaved).
  const std::pair<Shape, Shape> rotaryCases[] = {{Shape{2, 3, 5, 8}, Shape{1, 1, 5, 8}}, {Shape{3, 10}, Shape{1}},
                                                 {Shape{2, 4, 6}, Shape{4, 1}}, {Shape{2, 5, 3, 16}, Shape{1, 5, 1, 16}},
                                                 {Shape{2, 3, 32}, Shape{3, 32}}, {Shape{3, 16}, Shape{1}}};
  for (const auto &[xs, ts] : rotaryCases)
    for (bool interleaved : {false, true})
      for (bool transposed : {false, true}) {
        ctx = "bf16 rotary " + xs.str() + ts.str() + (interleaved ? " interleaved" : "") + (transposed ? " transposed" : "");
        auto x = randbf(xs.numel()), c = randv(ts.numel()), s = randv(ts.numel());
        auto xb = toBf(x);
        std::vector<float> yc(xs.numel());
        std::vector<bf> yg(xs.numel());
        pk::rotary(x.data(), xs, c.data(), ts, s.data(), ts, yc.data(), interleaved, transposed);
        pc::rotary(xb.data(), xs, c.data(), ts, s.data(), ts, yg.data(), interleaved, transposed);
        cmpBf(yc, yg, 1, "y");
      }
}

static void testBf16Movement() {
  for (int it = 0; it < 25; ++it) {
    Shape ds = randShape((int)ri(1, 4), 5);
    int axis = (int)ri(0, ds.size - 1);
    Shape is = randShape((int)ri(0, 2), 4);
    std::vector<int64_t> idx(is.numel());
    std::vector<int32_t> idx32(is.numel());
    for (size_t e = 0; e < idx.size(); ++e) idx32[e] = (int32_t)(idx[e] = ri(-ds.v[axis], ds.v[axis] - 1));
    Shape os;
    for (int i = 0; i < axis; ++i) os.push(ds.v[i]);
    for (int i = 0; i < is.size; ++i) os.push(is.v[i]);
    for (int i = axis + 1; i < ds.size; ++i) os.push(ds.v[i]);
    auto d = randbf(ds.numel());
    auto db = toBf(d);
    std::vector<float> c(os.numel());
    std::vector<bf> g(os.numel()), g32(os.numel());
    ctx = "bf16 gather " + ds.str() + is.str() + " axis " + std::to_string(axis);
    pk::gather(d.data(), ds, idx.data(), is, axis, c.data());
    pc::gather(db.data(), ds, idx.data(), is, axis, g.data());
    pc::gather(db.data(), ds, idx32.data(), is, axis, g32.data());
    cmpBf(c, g, 0, "out");
    cmpBf(c, g32, 0, "out (int32 indices)");
    // Embedding gradient: bf16 dy into float dx (exact inputs: the float tolerance).
    auto dy = randbf(os.numel());
    auto dyb = toBf(dy);
    std::vector<float> dc(ds.numel()), dg(ds.numel(), NAN), dg32(ds.numel(), NAN);
    pk::gatherGrad(dy.data(), idx.data(), is, axis, dc.data(), ds);
    pc::gatherGrad(dyb.data(), idx.data(), is, axis, dg.data(), ds);
    pc::gatherGrad(dyb.data(), idx32.data(), is, axis, dg32.data(), ds);
    cmp(dc, dg, 1e-6, "dx");
    cmp(dc, dg32, 1e-6, "dx (int32 indices)");
    Dims perm;
    for (int i = 0; i < ds.size; ++i) perm.push(i);
    std::shuffle(perm.v, perm.v + perm.size, rng);
    std::vector<float> tc(ds.numel());
    std::vector<bf> tg(ds.numel());
    ctx = "bf16 transpose";
    pk::transpose(d.data(), ds, perm, tc.data());
    pc::transpose(db.data(), ds, perm, tg.data());
    cmpBf(tc, tg, 0, "y");
    int cnt = (int)ri(1, 3);
    std::vector<Shape> shapes;
    std::vector<std::vector<float>> ins;
    std::vector<std::vector<bf>> insb;
    std::vector<const float *> ptrs;
    std::vector<const bf *> ptrsb;
    Dims sizes;
    int64_t tot = 0;
    for (int i = 0; i < cnt; ++i) {
      Shape s = ds;
      s.v[axis] = ri(0, 3);
      sizes.push(s.v[axis]);
      tot += s.v[axis];
      shapes.push_back(s);
      ins.push_back(randbf(s.numel()));
      insb.push_back(toBf(ins.back()));
    }
    for (int i = 0; i < cnt; ++i) ptrs.push_back(ins[i].data()), ptrsb.push_back(insb[i].data());
    Shape cs = ds;
    cs.v[axis] = tot;
    std::vector<float> cc(cs.numel());
    std::vector<bf> cg(cs.numel());
    ctx = "bf16 concat";
    pk::concat(ptrs.data(), shapes.data(), cnt, axis, cc.data());
    pc::concat(ptrsb.data(), shapes.data(), cnt, axis, cg.data());
    cmpBf(cc, cg, 0, "y");
    std::vector<std::vector<float>> oc;
    std::vector<std::vector<bf>> og;
    std::vector<float *> pcs;
    std::vector<bf *> pgs;
    for (auto &s : shapes) { oc.emplace_back(s.numel()); og.emplace_back(s.numel()); }
    for (int i = 0; i < cnt; ++i) { pcs.push_back(oc[i].data()); pgs.push_back(og[i].data()); }
    ctx = "bf16 split";
    pk::split(cc.data(), cs, axis, sizes, pcs.data());
    pc::split(cg.data(), cs, axis, sizes, pgs.data());
    for (int i = 0; i < cnt; ++i) cmpBf(oc[i], og[i], 0, "piece");
    Dims st, en, sp;
    for (int a = 0; a < ds.size; ++a) {
      int64_t dim = ds.v[a], step = ri(1, 3) * (ri(0, 1) ? 1 : -1);
      if (step > 0) { st.push(ri(0, dim)); en.push(ri(0, dim)); }
      else { st.push(ri(-1, dim - 1)); en.push(ri(-1, dim - 1)); }
      sp.push(step);
    }
    Shape ss = pk::sliceShape(ds, st, en, sp);
    std::vector<float> sc(ss.numel());
    std::vector<bf> sg(ss.numel());
    ctx = "bf16 slice " + ds.str() + st.str() + en.str() + sp.str();
    pk::slice(d.data(), ds, st, en, sp, sc.data());
    pc::slice(db.data(), ds, st, en, sp, sg.data());
    cmpBf(sc, sg, 0, "y");
    auto sdy = randbf(ss.numel());
    auto sdyb = toBf(sdy);
    std::vector<float> sdc(ds.numel());
    std::vector<bf> sdg(ds.numel(), bf(NAN));
    pk::sliceGrad(sdy.data(), sdc.data(), ds, st, en, sp);
    pc::sliceGrad(sdyb.data(), sdg.data(), ds, st, en, sp);
    cmpBf(sdc, sdg, 0, "dx");
    Dims pads;
    Shape ps;
    for (int a = 0; a < 2 * ds.size; ++a) pads.push(ri(0, 2));
    for (int a = 0; a < ds.size; ++a) ps.push(ds.v[a] + pads.v[a] + pads.v[a + ds.size]);
    std::vector<float> pcv(ps.numel());
    std::vector<bf> pgv(ps.numel());
    ctx = "bf16 pad";
    pk::pad(d.data(), ds, pads, 1.5f, pcv.data());
    pc::pad(db.data(), ds, pads, bf(1.5f), pgv.data());
    cmpBf(pcv, pgv, 0, "y");
    Shape xs = bcastOf(ds);
    auto xv = randbf(xs.numel());
    auto xvb = toBf(xv);
    std::vector<float> ec(ds.numel());
    std::vector<bf> eg(ds.numel());
    ctx = "bf16 expand";
    pk::expand(xv.data(), xs, ec.data(), ds);
    pc::expand(xvb.data(), xs, eg.data(), ds);
    cmpBf(ec, eg, 0, "y");
  }
}

// Sums of bf16 values into float (bias gradients): every schedule, and
// accumulate; the inputs are exact floats, so the float tolerance holds.
static void testBf16Reduce() {
  std::vector<std::pair<Shape, Dims>> cases = {{Shape{3, 300}, Dims{1}}, {Shape{300, 5}, Dims{0}}, {Shape{2, 20, 30}, Dims{1, 2}},
      {Shape{2000, 300}, Dims{0}}, {Shape{1100, 260}, Dims{1}}, {Shape{4, 300, 3}, Dims{1}}, {Shape{64, 40}, Dims{0}},
      {Shape{5, 7}, Dims{}}, {Shape{4096, 97}, Dims{0}}, {Shape{1, 6}, Dims{0}}};
  for (auto &[xs, axes] : cases) {
    Shape ys = xs;
    for (int i = 0; i < axes.size; ++i) ys.v[axes.v[i]] = 1;
    auto x = randbf(xs.numel());
    auto xb = toBf(x);
    std::vector<float> c(ys.numel()), g(ys.numel(), NAN);
    ctx = "bf16 reduceSum " + xs.str() + axes.str();
    pk::reduceSum(x.data(), xs, axes, c.data());
    pc::reduceSum(xb.data(), xs, axes, g.data());
    cmp(c, g, 1e-6, "y");
    auto into = randv(ys.numel()), intoG = into;
    pc::reduceSum(xb.data(), xs, axes, intoG.data(), true);
    for (size_t i = 0; i < into.size(); ++i) into[i] += c[i];
    cmp(into, intoG, 1e-6, "y accumulated");
    if (axes.size == 0) continue; // reduceMean's empty axes mean all axes
    std::vector<float> mc(ys.numel()), mg(ys.numel(), NAN);
    ctx = "bf16 reduceMean " + xs.str() + axes.str();
    pk::reduceMean(x.data(), xs, axes, mc.data());
    pc::reduceMean(xb.data(), xs, axes, mg.data());
    cmp(mc, mg, 1e-6, "y");
  }
}

// GEMMs on bf16 operands: the fake cuBLAS/cuBLASLt compute the bf16
// reference (operands widened, sum in double, the float32 epilogue, one
// rounding to D's type), the CPU sgemm sums in float: tolerance 2^-7
// (one bf16 ulp, relative; absolute near 0). A C other than a bias row is
// rounded to bf16 into Y before the product (docs/cuda-kernels.md), within
// the same tolerance at these magnitudes.
static void testBf16Linalg() {
  const pk::Unary activations[] = {pk::Unary::Relu, pk::Unary::GeluTanh, pk::Unary::Tanh};
  const int bf16Before = emu::gemmBf16Calls, ltBefore = emu::ltBf16Calls;
  // First with cublasLtMatmul refusing what its heuristic offered: every
  // shape falls back to cuBLAS at its first call, and stays there.
  for (bool matmulRefuses : {true, false}) {
    emu::ltMatmulRefuses = matmulRefuses;
    for (int it = 0; it < 50; ++it) {
      const int64_t M = ri(1, 7), N = ri(1, 7), K = ri(it % 15 == 0 ? 0 : 1, 9);
      const bool ta = ri(0, 1), tb = ri(0, 1);
      const std::optional<pk::Unary> activation =
          it % 4 == 3 ? std::nullopt : std::optional<pk::Unary>(activations[it % 3]);
      const int cKind = (int)ri(0, 3); // none, [N], [1, N], another broadcast shape
      const Shape cs = cKind == 1 ? Shape{N} : cKind == 2 ? Shape{1, N} : bcastOf(Shape{M, N});
      const float beta = cKind == 3 && ri(0, 1) ? 0.5f : 1.0f;
      const int64_t offset = ri(0, 3); // in elements: off cuBLASLt's default alignment
      auto A = randbf(M * K + offset), B = randbf(K * N + offset), C = randv(cs.numel() + offset);
      auto Ab = toBf(A), Bb = toBf(B);
      std::vector<float> yc(M * N);
      std::vector<bf> yg(M * N + offset, bf(NAN));
      const float *c = cKind == 0 ? nullptr : C.data() + offset;
      ctx = "bf16 gemm " + std::string(activation ? pipec::unaryName(*activation) : "none") + " M" + std::to_string(M) +
            " N" + std::to_string(N) + " K" + std::to_string(K) + " C" + cs.str() + (cKind ? "" : "(none)") + " ta" +
            std::to_string(ta) + " tb" + std::to_string(tb) + (matmulRefuses ? " (cublasLtMatmul refuses)" : "");
      pk::gemm(A.data() + offset, B.data() + offset, c, cs, yc.data(), M, N, K, ta, tb, 0.7f, beta, activation);
      pc::gemm(Ab.data() + offset, Bb.data() + offset, c, cs, yg.data() + offset, M, N, K, ta, tb, 0.7f, beta,
               activation);
      cmpBfTol(yc, std::vector<bf>(yg.begin() + offset, yg.end()), 1.0 / 128, "y");
      // Into float Y: a weight gradient accumulating in place (C == Y, beta 1).
      auto acc = randv(M * N), accG = acc;
      pk::gemm(A.data() + offset, B.data() + offset, acc.data(), Shape{M, N}, acc.data(), M, N, K, ta, tb, 1.0f, 1.0f);
      pc::gemm(Ab.data() + offset, Bb.data() + offset, accG.data(), Shape{M, N}, accG.data(), M, N, K, ta, tb, 1.0f,
               1.0f);
      cmp(acc, accG, 1e-5, "float Y accumulated");
      std::vector<float> yf(M * N, NAN);
      pc::gemm(Ab.data() + offset, Bb.data() + offset, c, cs, yf.data(), M, N, K, ta, tb, 0.7f, beta, activation);
      cmp(yc, yf, 1e-5, "float Y");
    }
  }
  emu::ltMatmulRefuses = false;
  std::vector<std::pair<Shape, Shape>> mm = {
      {Shape{3, 4}, Shape{4, 5}}, {Shape{4}, Shape{4, 5}}, {Shape{2, 3, 4}, Shape{4, 5}}, {Shape{2, 3, 4}, Shape{2, 4, 5}},
      {Shape{1, 2, 3, 4}, Shape{2, 1, 4, 5}}, {Shape{2, 3, 0}, Shape{0, 5}}, {Shape{3, 2, 3, 4}, Shape{1, 4, 5}}};
  for (auto &[as, bs] : mm)
    for (int t = 0; t < 2; ++t) {
      const bool tb = t == 1 && bs.size >= 2;
      Shape bstored = bs;
      if (tb) std::swap(bstored.v[bs.size - 1], bstored.v[bs.size - 2]);
      Shape ys = pk::matmulShape(as, bs);
      auto A = randbf(as.numel()), B = randbf(bs.numel());
      auto Ab = toBf(A), Bb = toBf(B);
      std::vector<float> yc(ys.numel()), yf(ys.numel(), NAN);
      std::vector<bf> yg(ys.numel(), bf(NAN));
      ctx = "bf16 matmul " + as.str() + bstored.str() + (tb ? "^T" : "");
      pk::matmul(A.data(), as, B.data(), bstored, yc.data(), false, tb);
      pc::matmul(Ab.data(), as, Bb.data(), bstored, yg.data(), false, tb);
      pc::matmul(Ab.data(), as, Bb.data(), bstored, yf.data(), false, tb);
      cmpBfTol(yc, yg, 1.0 / 128, "y");
      cmp(yc, yf, 1e-5, "float Y");
    }
  ctx = "bf16 gemm operand types";
  ++checks;
  if (emu::gemmBf16Calls - bf16Before < 50 || emu::ltBf16Calls - ltBefore < 20 ||
      emu::lastGemmTypes.a != CUDA_R_16BF || emu::lastGemmTypes.b != CUDA_R_16BF ||
      emu::lastGemmTypes.computeType != CUBLAS_COMPUTE_32F) {
    std::printf("FAIL %s: %d cuBLAS and %d cuBLASLt GEMMs on bf16 operands\n", ctx.c_str(),
                emu::gemmBf16Calls - bf16Before, emu::ltBf16Calls - ltBefore);
    ++failures;
  }
}

// Layer norm on bf16 activations with float parameters and statistics.
// y and dx: 1 bf16 ulp relative (2^-7) on top of the float test's
// tolerances (the row statistics are the float kernel's on the same inputs);
// mean, invStd and the parameter gradients (float) the float tolerances.
static void testBf16Norm() {
  // Rows of 768 and 40 (and 9 x 768 along axis 0) move in packs of 8 bf16: 768 in 3 tiles of the
  // parameter gradient's columns, 40 in a part of one; 700, 6, 5 and 3 one element at a time.
  std::vector<Shape> lshapes = {Shape{4, 6}, Shape{2, 3, 5}, Shape{3, 700}, Shape{50, 4, 3}, Shape{9, 768},
                                Shape{300, 40}};
  for (auto &xs : lshapes)
    for (int axis = -xs.size; axis < xs.size; ++axis) {
      const int a = axis < 0 ? axis + xs.size : axis;
      Shape ns(xs.v + a, xs.size - a);
      for (int pv = 0; pv < 2; ++pv)
        for (const pk::RowNorm norm : {pk::RowNorm::Layer, pk::RowNorm::Rms}) {
          Shape ps = pv == 0 ? ns : bcastOf(ns);
          auto x = randbf(xs.numel()), g = randv(ps.numel()), b = randv(ps.numel()), dy = randbf(xs.numel());
          auto xb = toBf(x), dyb = toBf(dy);
          const int64_t rows = pk::Shape(xs.v, a).numel();
          std::vector<float> yc(xs.numel()), mc(rows), mg(rows), ic(rows), ig(rows);
          std::vector<bf> yg(xs.numel());
          ctx = "bf16 layerNorm " + xs.str() + " axis " + std::to_string(axis) + " ps " + ps.str() +
                (norm == pk::RowNorm::Rms ? " (RMS)" : "");
          pk::layerNorm(x.data(), xs, g.data(), ps, b.data(), ps, yc.data(), mc.data(), ic.data(), axis, 1e-5f, norm);
          pc::layerNorm(xb.data(), xs, g.data(), ps, b.data(), ps, yg.data(), mg.data(), ig.data(), axis, 1e-5f, norm);
          cmpBfTol(yc, yg, 1.0 / 128 + 1e-4, "y");
          cmp(mc, mg, 1e-5, "mean");
          cmp(ic, ig, 1e-4, "invstd");
          std::vector<float> dc(xs.numel());
          std::vector<bf> dg(xs.numel());
          pk::layerNormGrad(dy.data(), x.data(), xs, g.data(), ps, dc.data(), axis, 1e-5f, norm);
          pc::layerNormGrad(dyb.data(), xb.data(), xs, g.data(), ps, dg.data(), axis, 1e-5f, norm);
          cmpBfTol(dc, dg, 1.0 / 128 + 1e-3, "dx");
          std::vector<float> dsc(ps.numel()), dbc(ps.numel()), dsg(ps.numel()), dbg(ps.numel());
          pk::layerNormParamGrad(dy.data(), x.data(), xs, ps, dsc.data(), dbc.data(), axis, 1e-5f, norm);
          pc::layerNormParamGrad(dyb.data(), xb.data(), xs, ps, dsg.data(), dbg.data(), axis, 1e-5f, norm);
          cmp(dsc, dsg, 1e-4, "dscale");
          cmp(dbc, dbg, 1e-4, "dbias");
          auto gsg = randv(ps.numel()), gbg = randv(ps.numel()), wantS = gsg, wantB = gbg;
          pc::layerNormParamGrad(dyb.data(), xb.data(), xs, ps, gsg.data(), gbg.data(), axis, 1e-5f, norm,
                                 pk::Workspace{}, true);
          for (int64_t i = 0; i < ps.numel(); ++i) wantS[i] += dsc[i], wantB[i] += dbc[i];
          cmp(wantS, gsg, 1e-4, "dscale accumulated");
          cmp(wantB, gbg, 1e-4, "dbias accumulated");
        }
    }
}

// Softmaxes and cross-entropy on bf16 values: the float kernels' math on the
// widened inputs, one rounding on store. Probabilities within 1 bf16 ulp;
// gradients (y(dy - Σ dy·y) cancels) and losses 2^-7 relative plus the
// float test's tolerance; the scalar loss is float (the float tolerance).
static void testBf16Softmax() {
  std::vector<Shape> shapes = {Shape{4, 7}, Shape{3, 600}, Shape{2, 5, 3}, Shape{3, 1100, 2}, Shape{2100, 3}};
  for (auto &xs : shapes)
    for (int axis = -xs.size; axis < xs.size; ++axis) {
      auto x = randbf(xs.numel(), -5, 5), dy = randbf(xs.numel());
      auto xb = toBf(x), dyb = toBf(dy);
      std::vector<float> c(xs.numel()), dc(xs.numel());
      std::vector<bf> g(xs.numel()), dg(xs.numel());
      ctx = "bf16 softmax " + xs.str() + " axis " + std::to_string(axis);
      pk::softmax(x.data(), xs, axis, c.data());
      pc::softmax(xb.data(), xs, axis, g.data());
      cmpBf(c, g, 1, "y");
      auto yr = fromBf(g); // the gradient reads the stored bf16 y
      pk::softmaxGrad(dy.data(), yr.data(), xs, axis, dc.data());
      pc::softmaxGrad(dyb.data(), g.data(), xs, axis, dg.data());
      cmpBfTol(dc, dg, 1.0 / 128 + 1e-5, "dx");
    }
  for (auto &xs : shapes)
    for (int variant = 0; variant < 4; ++variant) {
      const Shape ms = bcastOf(xs);
      std::vector<uint8_t> mask(ms.numel());
      for (auto &m : mask) m = (uint8_t)(ri(0, 3) == 0);
      const float scale = variant % 2 ? 8.0f : 0.125f, fill = variant < 2 ? -INFINITY : -1.0e4f;
      const bool divide = variant % 2, maskedWhen = variant != 1;
      auto x = randbf(xs.numel(), -5, 5), dy = randbf(xs.numel());
      auto xb = toBf(x), dyb = toBf(dy);
      std::vector<float> c(xs.numel()), dc(xs.numel());
      std::vector<bf> g(xs.numel()), dg(xs.numel());
      ctx = "bf16 maskedSoftmax " + xs.str() + " mask " + ms.str() + " variant " + std::to_string(variant);
      pk::maskedSoftmax(x.data(), xs, mask.data(), ms, scale, divide, fill, maskedWhen, c.data());
      pc::maskedSoftmax(xb.data(), xs, mask.data(), ms, scale, divide, fill, maskedWhen, g.data());
      cmpBf(c, g, 1, "y");
      auto yr = fromBf(g);
      pk::maskedSoftmaxGrad(dy.data(), yr.data(), xs, mask.data(), ms, scale, divide, maskedWhen, dc.data());
      pc::maskedSoftmaxGrad(dyb.data(), g.data(), xs, mask.data(), ms, scale, divide, maskedWhen, dg.data());
      cmpBfTol(dc, dg, 1.0 / 128 + 1e-5, "dx");
    }
  // Shape{5, 1001}: rows starting at every offset from a 16-byte boundary, each with a head, whole
  // 16-byte packs and a tail (softmax.cu's forEachClass); Shape{8, 5}: rows shorter than their head.
  std::vector<Shape> ls = {Shape{8, 5}, Shape{3, 700}, Shape{2, 4, 3}, Shape{3, 4, 700}, Shape{0, 3}, Shape{5, 1001}};
  for (auto &ss : ls)
    for (int red = 0; red < 3; ++red)
      for (int variant = 0; variant < 4; ++variant) {
        const int64_t C = ss.v[1];
        Shape lshape{ss.v[0]};
        for (int a = 2; a < ss.size; ++a) lshape.push(ss.v[a]);
        auto s = randbf(ss.numel(), -4, 4);
        auto sb = toBf(s);
        std::vector<int64_t> lab(lshape.numel());
        for (auto &l : lab) l = ri(0, C - 1);
        std::vector<int32_t> lab32(lab.begin(), lab.end());
        std::optional<int64_t> ign;
        if (variant & 1) { ign = 1; for (size_t e = 0; e < lab.size(); ++e) if (ri(0, 2) == 0) lab[e] = lab32[e] = 1; }
        std::vector<float> w;
        if (variant & 2) w = randv(C, 0.1f, 2);
        const float *wp = w.empty() ? nullptr : w.data();
        const int64_t ln = red == 0 ? lshape.numel() : 1;
        std::vector<float> lc(ln), lg(ln, NAN), lg32(ln, NAN), pc_(ss.numel());
        std::vector<bf> pg(ss.numel());
        ctx = "bf16 sce " + ss.str() + " red " + std::to_string(red) + " var " + std::to_string(variant);
        pk::softmaxCrossEntropyLoss(s.data(), ss, lab.data(), wp, (pk::Reduction)red, ign, lc.data(), pc_.data());
        pc::softmaxCrossEntropyLoss(sb.data(), ss, lab.data(), wp, (pk::Reduction)red, ign, lg.data(), pg.data());
        pc::softmaxCrossEntropyLoss(sb.data(), ss, lab32.data(), wp, (pk::Reduction)red, ign, lg32.data(),
                                    (bf *)nullptr);
        cmp(lc, lg, 1e-5, "loss");
        cmp(lc, lg32, 1e-5, "loss (int32 labels)");
        cmpBf(pc_, pg, 1, "logprob");
        auto dl = randv(ln);
        std::vector<float> dc(ss.numel());
        std::vector<bf> dg(ss.numel());
        pk::softmaxCrossEntropyLossGrad(dl.data(), s.data(), ss, lab.data(), wp, (pk::Reduction)red, ign, dc.data());
        pc::softmaxCrossEntropyLossGrad(dl.data(), sb.data(), ss, lab.data(), wp, (pk::Reduction)red, ign, dg.data());
        cmpBfTol(dc, dg, 1.0 / 128 + 1e-5, "dscores");
        if (ss.size == 2 && ss.v[1] == 1001) { // outputs off the scores' offset from a 16-byte boundary
          std::vector<bf> shifted(ss.numel() + 1), shiftedLp(ss.numel() + 1);
          pc::softmaxCrossEntropyLoss(sb.data(), ss, lab.data(), wp, (pk::Reduction)red, ign, lg.data(),
                                      shiftedLp.data() + 1);
          cmpBf(pc_, std::vector<bf>(shiftedLp.begin() + 1, shiftedLp.end()), 1, "logprob, output shifted");
          pc::softmaxCrossEntropyLossGrad(dl.data(), sb.data(), ss, lab.data(), wp, (pk::Reduction)red, ign,
                                          shifted.data() + 1);
          cmpBfTol(dc, std::vector<bf>(shifted.begin() + 1, shifted.end()), 1.0 / 128 + 1e-5,
                   "dscores, output shifted");
        }
      }
}

/// A class axis padded past `classes` with scores of -inf (pipec-pad-classes):
/// the bf16 CUDA loss on [rows, 1024] with classes 1001 against the CPU float
/// loss on the unpadded [rows, 1001]; the padding's gradient exactly 0; a
/// label in the padding reported as out of range, on both targets.
static void testPaddedClasses() {
  const int64_t rows = 6, classes = 1001, padded = 1024;
  const Shape real{rows, classes}, wide{rows, padded};
  for (int red = 0; red < 3; ++red) {
    auto s = randbf(real.numel(), -4, 4);
    std::vector<float> sp(wide.numel(), -INFINITY);
    for (int64_t r = 0; r < rows; ++r) std::copy(s.begin() + r * classes, s.begin() + (r + 1) * classes, sp.begin() + r * padded);
    auto sb = toBf(sp);
    std::vector<int64_t> lab(rows);
    for (auto &l : lab) l = ri(0, classes - 1);
    lab[0] = classes - 1;
    auto w = randv(classes, 0.1f, 2);
    std::vector<float> wp(w);
    wp.resize(padded, 0.0f);
    const int64_t ln = red == 0 ? rows : 1;
    std::vector<float> lc(ln), lg(ln, NAN), lcPadded(ln, NAN);
    ctx = "padded classes red " + std::to_string(red);
    pk::softmaxCrossEntropyLoss(s.data(), real, lab.data(), w.data(), (pk::Reduction)red, std::nullopt, lc.data(), nullptr);
    pc::softmaxCrossEntropyLoss(sb.data(), wide, lab.data(), wp.data(), (pk::Reduction)red, std::nullopt, lg.data(),
                                (bf *)nullptr, pk::Workspace{}, classes);
    pk::softmaxCrossEntropyLoss(sp.data(), wide, lab.data(), wp.data(), (pk::Reduction)red, std::nullopt,
                                lcPadded.data(), nullptr, pk::Workspace{}, classes);
    cmp(lc, lg, 1e-5, "loss");
    cmp(lc, lcPadded, 1e-6, "loss (CPU, padded)");
    auto dl = randv(ln);
    std::vector<float> dc(real.numel());
    std::vector<bf> dg(wide.numel());
    pk::softmaxCrossEntropyLossGrad(dl.data(), s.data(), real, lab.data(), w.data(), (pk::Reduction)red, std::nullopt,
                                    dc.data());
    pc::softmaxCrossEntropyLossGrad(dl.data(), sb.data(), wide, lab.data(), wp.data(), (pk::Reduction)red,
                                    std::nullopt, dg.data(), pk::Workspace{}, classes);
    std::vector<bf> dgReal(real.numel());
    bool paddingZero = true;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < padded; ++c) {
        if (c < classes) dgReal[r * classes + c] = dg[r * padded + c];
        else paddingZero = paddingZero && fromBf(std::vector<bf>{dg[r * padded + c]})[0] == 0.0f;
      }
    cmpBfTol(dc, dgReal, 1.0 / 128 + 1e-5, "dscores");
    ++checks;
    if (!paddingZero) { ++failures; std::printf("FAIL %s: the padding's gradient is not 0\n", ctx.c_str()); }
  }
  ctx = "padded classes, a label in the padding";
  std::vector<float> s(2 * 16, 0.0f), loss(1);
  const std::vector<int64_t> lab{3, 12};
  auto sb = toBf(s);
  pc::softmaxCrossEntropyLoss(sb.data(), Shape{2, 16}, lab.data(), nullptr, pk::Reduction::Mean, std::nullopt,
                              loss.data(), (bf *)nullptr, pk::Workspace{}, 10);
  const bool device = throws([] { pc::raiseDeviceErrors(); });
  const bool host = throws([&] {
    pk::softmaxCrossEntropyLoss(s.data(), Shape{2, 16}, lab.data(), nullptr, pk::Reduction::Mean, std::nullopt,
                                loss.data(), nullptr, pk::Workspace{}, 10);
  });
  ++checks;
  if (!device || !host) { ++failures; std::printf("FAIL %s: not reported (CUDA %d, CPU %d)\n", ctx.c_str(), device, host); }
}

/// An attention of the bf16 tests: operand shapes, the mask's shape and kind
/// (0 none, 1 boolean, 2 additive), and whether the scale divides.
struct AttentionCase { Shape qs, ks, vs, ms; int maskKind; bool divide; };
/// The check context of `c` at dropout `ratio`.
static std::string attentionContext(const char *what, const AttentionCase &c, float ratio) {
  static const char *const maskNames[] = {"", " masked", " additive"};
  return std::string(what) + " q " + c.qs.str() + " k " + c.ks.str() + " v " + c.vs.str() + maskNames[c.maskKind] +
         (c.divide ? " divide" : "") + (ratio > 0 ? " dropout" : "");
}
/// Random q, k, v of `c`, bf16-representable: float for the CPU kernels, bf16 for CUDA.
struct AttentionInputs {
  std::vector<float> q, k, v;
  std::vector<bf> qb, kb, vb;
};
static AttentionInputs attentionInputs(const AttentionCase &c) {
  AttentionInputs in;
  in.q = randbf(c.qs.numel());
  in.k = randbf(c.ks.numel());
  in.v = randbf(c.vs.numel());
  in.qb = toBf(in.q), in.kb = toBf(in.k), in.vb = toBf(in.v);
  return in;
}

// Attention on bf16 q, k, v (dy) against the CPU float attention on the
// same bf16-rounded inputs; the gradient of both reads the CPU's y rounded
// to bf16 (what a bf16 stage stores) and its lse. Row blocks of 64 query
// rows: S = 5, 7, 65, 70, 150 (1 to 3 blocks); T = 600 packs each row in
// two rounds of 512 lanes (softmax.cu, packRowBf16). Each call runs in a
// workspace of exactly the float call's planned scratch. Tolerances: lse is
// float math on exact inputs (the float test's 1e-5); y = Σ P v with P
// rounded to bf16 (2^-9 each, Σ P <= 1/(1 - ratio), |v| <= 2) and y rounded
// once: 2^-7 relative to 1 + |y|. The gradients multiply P and dz rounded
// to bf16 (2^-9 of each term), and dk, dv are rounded once more per row
// block as they accumulate (softmax.cu, attentionGradT); dz · k and dzᵀ · q
// cancel their terms (dz sums to ~0 over a row), so the error is relative
// to the terms, not to each result: checked norm-wise, 2^-5 of 1 + the
// largest element (200 draws of these cases stayed under 1.2 · 2^-7).
static void testBf16Attention() {
  setenv("PIPEC_CUDNN_ATTENTION", "0", 1); // pipec's own attention kernels (testFlashAttention: cuDNN's)
  constexpr double kGradTol = 1.0 / 32;
  const AttentionCase cases[] = {{Shape{2, 3, 5, 4}, Shape{2, 3, 6, 4}, Shape{2, 3, 6, 3}, Shape{1, 1, 5, 6}, 1, false},
                                 {Shape{2, 70, 4}, Shape{2, 9, 4}, Shape{2, 9, 5}, Shape{70, 9}, 1, true},
                                 {Shape{3, 7, 2}, Shape{3, 7, 2}, Shape{3, 7, 2}, Shape{}, 0, false},
                                 {Shape{2, 70, 4}, Shape{2, 9, 4}, Shape{2, 9, 5}, Shape{2, 1, 9}, 2, false},
                                 {Shape{1, 150, 8}, Shape{1, 13, 8}, Shape{1, 13, 6}, Shape{150, 13}, 1, false},
                                 {Shape{2, 65, 4}, Shape{2, 5, 4}, Shape{2, 5, 4}, Shape{}, 0, true},
                                 {Shape{1, 130, 4}, Shape{1, 600, 4}, Shape{1, 600, 3}, Shape{1, 600}, 2, false}};
  const uint64_t key = pk::dropoutStreamKey(11, 5, 3, pk::dropoutOpId("attn_dropout"));
  const int bf16Before = emu::gemmBf16Calls;
  for (const AttentionCase &c : cases)
    for (float ratio : {0.0f, 0.3f}) {
      ctx = attentionContext("bf16 attention", c, ratio);
      auto [q, k, v, qb, kb, vb] = attentionInputs(c);
      std::vector<uint8_t> mask(c.ms.numel());
      for (size_t e = 0; e < mask.size(); ++e) mask[e] = e % 3 == 2;
      const auto bias = randv(c.ms.numel());
      const uint8_t *m = c.maskKind == 1 ? mask.data() : nullptr;
      const float *a = c.maskKind == 2 ? bias.data() : nullptr;
      const int64_t rows = c.qs.numel() / c.qs.v[c.qs.size - 1], out = rows * c.vs.v[c.vs.size - 1];
      std::vector<float> yc(out), lc(rows), lg(rows, NAN);
      std::vector<bf> yg(out, bf(NAN));
      pk::attention(q.data(), c.qs, k.data(), c.ks, v.data(), c.vs, m, a, c.ms, 0.5f, c.divide, -1e9f, true, ratio, true,
                    key, yc.data(), lc.data());
      // Into a workspace of exactly the float call's planned scratch
      // (NaN-filled, so unwritten reads show), guarded past its end.
      const int64_t fwdBytes = pk::attentionScratch(pipec::Target::Cuda, c.qs, c.ks, c.vs).shared;
      std::vector<float> ws((size_t)(fwdBytes / 4 + 64), NAN);
      std::fill(ws.begin() + fwdBytes / 4, ws.end(), 12345.0f);
      pc::attention(qb.data(), c.qs, kb.data(), c.ks, vb.data(), c.vs, m, a, c.ms, 0.5f, c.divide, -1e9f, true, ratio,
                    true, key, yg.data(), lg.data(), pk::Workspace{ws.data(), fwdBytes});
      cmpBfTol(yc, yg, 1.0 / 128, "y");
      cmp(lc, lg, 1e-5, "lse");
      cmp(std::vector<float>(ws.begin() + fwdBytes / 4, ws.end()), std::vector<float>(64, 12345.0f), 0,
          "scratch guard");
      if (ratio > 0) { // with v the identity, y is the dropped P: the same zeros
        Shape is = c.vs;
        const int64_t T = c.ks.v[c.ks.size - 2];
        is.v[is.size - 1] = T;
        std::vector<float> identity(is.numel()), pc1(rows * T), l(rows);
        std::vector<bf> pg1(rows * T);
        for (int64_t e = 0; e < is.numel(); ++e) identity[e] = (e / T) % T == e % T ? 1.0f : 0.0f;
        auto identityB = toBf(identity);
        pk::attention(q.data(), c.qs, k.data(), c.ks, identity.data(), is, m, a, c.ms, 0.5f, c.divide, -1e9f, true,
                      ratio, true, key, pc1.data(), l.data());
        pc::attention(qb.data(), c.qs, kb.data(), c.ks, identityB.data(), is, m, a, c.ms, 0.5f, c.divide, -1e9f, true,
                      ratio, true, key, pg1.data(), l.data());
        std::vector<uint8_t> zerosC(pc1.size()), zerosG(pg1.size());
        for (size_t e = 0; e < pc1.size(); ++e) zerosC[e] = pc1[e] == 0.0f, zerosG[e] = (float)pg1[e] == 0.0f;
        cmp(zerosC, zerosG, 0, "dropped elements");
        cmpBf(pc1, pg1, 1, "dropped P"); // P in float, rounded once to bf16 (y = P · I)
      }
      auto dy = randbf(out), yr = roundBf(yc);
      auto dyb = toBf(dy), yb = toBf(yc);
      std::vector<float> dqc(q.size()), dkc(k.size()), dvc(v.size());
      std::vector<bf> dqg(q.size(), bf(NAN)), dkg(k.size(), bf(NAN)), dvg(v.size(), bf(NAN));
      pk::attentionGrad(dy.data(), q.data(), c.qs, k.data(), c.ks, v.data(), c.vs, m, a, c.ms, yr.data(), lc.data(),
                        0.5f, c.divide, -1e9f, true, ratio, true, key, dqc.data(), dkc.data(), dvc.data());
      const int64_t gradBytes = pk::attentionGradScratch(pipec::Target::Cuda, c.qs, c.ks, c.vs).shared;
      std::vector<float> wsg((size_t)(gradBytes / 4 + 64), NAN);
      std::fill(wsg.begin() + gradBytes / 4, wsg.end(), 12345.0f);
      pc::attentionGrad(dyb.data(), qb.data(), c.qs, kb.data(), c.ks, vb.data(), c.vs, m, a, c.ms, yb.data(), lc.data(),
                        0.5f, c.divide, -1e9f, true, ratio, true, key, dqg.data(), dkg.data(), dvg.data(),
                        pk::Workspace{wsg.data(), gradBytes});
      cmpBfNormwise(dqc, dqg, kGradTol, "dq");
      cmpBfNormwise(dkc, dkg, kGradTol, "dk");
      cmpBfNormwise(dvc, dvg, kGradTol, "dv");
      cmp(std::vector<float>(wsg.begin() + gradBytes / 4, wsg.end()), std::vector<float>(64, 12345.0f), 0,
          "scratch guard");
    }
  // Empty S (dk, dv zero) and empty T (y zero).
  for (int e = 0; e < 2; ++e) {
    const Shape qs = e == 0 ? Shape{2, 0, 4} : Shape{2, 3, 4}, ks = e == 0 ? Shape{2, 5, 4} : Shape{2, 0, 4},
                vs = e == 0 ? Shape{2, 5, 3} : Shape{2, 0, 3};
    ctx = "bf16 attention empty q " + qs.str() + " k " + ks.str();
    std::vector<bf> q(qs.numel(), bf(1.0f)), k(ks.numel(), bf(1.0f)), v(vs.numel(), bf(1.0f));
    const int64_t rows = qs.numel() / 4;
    std::vector<bf> y(rows * 3, bf(NAN)), dy(rows * 3, bf(1.0f)), dq(q.size(), bf(NAN)), dk(k.size(), bf(NAN)),
        dv(v.size(), bf(NAN));
    std::vector<float> lse(rows, 0.0f);
    pc::attention(q.data(), qs, k.data(), ks, v.data(), vs, nullptr, nullptr, Shape{}, 1.0f, false, 0.0f, true, 0.0f,
                  false, 0, y.data(), lse.data());
    pc::attentionGrad(dy.data(), q.data(), qs, k.data(), ks, v.data(), vs, nullptr, nullptr, Shape{}, y.data(),
                      lse.data(), 1.0f, false, 0.0f, true, 0.0f, false, 0, dq.data(), dk.data(), dv.data());
    cmpBf(std::vector<float>(y.size(), 0.0f), y, 0, "y");
    cmpBf(std::vector<float>(dq.size(), 0.0f), dq, 0, "dq");
    cmpBf(std::vector<float>(dk.size(), 0.0f), dk, 0, "dk");
    cmpBf(std::vector<float>(dv.size(), 0.0f), dv, 0, "dv");
  }
  ctx = "bf16 attention operand types";
  ++checks;
  if (emu::gemmBf16Calls - bf16Before < 100 || emu::lastGemmTypes.a != CUDA_R_16BF ||
      emu::lastGemmTypes.computeType != CUBLAS_COMPUTE_32F) {
    std::printf("FAIL %s: %d GEMMs on bf16 operands\n", ctx.c_str(), emu::gemmBf16Calls - bf16Before);
    ++failures;
  }
  unsetenv("PIPEC_CUDNN_ATTENTION");
}

// bf16 attention through cuDNN's flash attention (attention_cudnn.cu, under
// the fake cudnn_frontend.h) against the CPU float attention on the same
// bf16-rounded inputs, as testBf16Attention checks pipec's kernels: q, k, v
// [L..., S|T, D] seen as [b, h, S|T, D] (ranks 3 to 5), boolean masks
// broadcast over b, h or neither written as a bf16 bias, an additive mask,
// dropout keyed on the device (the stream key generated code passes). The
// tolerances are testBf16Attention's, except where the bias is an additive
// mask rounded to bf16 (2^-9 of |bias| <= 1 moves z, so lse, by up to 2^-8).
// Then the same calls with PIPEC_CUDNN_ATTENTION=0 must not reach cuDNN, and
// head sizes cuDNN has no engine for must fall back to pipec's kernels.
static void testFlashAttention() {
  constexpr double kGradTol = 1.0 / 32;
  const AttentionCase cases[] = {{Shape{2, 3, 37, 16}, Shape{2, 3, 29, 16}, Shape{2, 3, 29, 8}, Shape{1, 1, 37, 29}, 1, false},
                                 {Shape{2, 3, 20, 8}, Shape{2, 3, 16, 8}, Shape{2, 3, 16, 16}, Shape{2, 1, 1, 16}, 1, true},
                                 {Shape{2, 3, 9, 8}, Shape{2, 3, 16, 8}, Shape{2, 3, 16, 16}, Shape{3, 9, 16}, 1, false},
                                 {Shape{3, 17, 8}, Shape{3, 11, 8}, Shape{3, 11, 8}, Shape{3, 17, 11}, 2, false},
                                 {Shape{1, 2, 2, 9, 8}, Shape{1, 2, 2, 8, 8}, Shape{1, 2, 2, 8, 8}, Shape{}, 0, true}};
  uint64_t callKey = pk::dropoutCallKey(11, 5, 3); // "device memory": the emulation's device is the host
  const uint64_t opId = pk::dropoutOpId("attn_dropout");
  const uint64_t cpuKey = pk::dropoutOpStreamKey(callKey, opId);
  const pc::StreamKey deviceKey(&callKey, opId);
  for (const AttentionCase &c : cases)
    for (float ratio : {0.0f, 0.3f}) {
      ctx = attentionContext("flash attention", c, ratio);
      auto [q, k, v, qb, kb, vb] = attentionInputs(c);
      std::vector<uint8_t> mask(c.ms.numel());
      // Irregular (so that a bias taken from the wrong head or sequence shows), key 0 of every row kept.
      for (size_t e = 0; e < mask.size(); ++e)
        mask[e] = ((uint32_t)e * 2654435761u >> 9) % 3 == 0 && e % c.ks.v[c.ks.size - 2] != 0;
      const auto bias = randv(c.ms.numel(), -1, 1);
      const uint8_t *m = c.maskKind == 1 ? mask.data() : nullptr;
      const float *a = c.maskKind == 2 ? bias.data() : nullptr;
      const int64_t rows = c.qs.numel() / c.qs.v[c.qs.size - 1], out = rows * c.vs.v[c.vs.size - 1];
      const int64_t T = c.ks.v[c.ks.size - 2];
      std::vector<float> yc(out), lc(rows), lg(rows, NAN);
      std::vector<bf> yg(out, bf(NAN));
      pk::attention(q.data(), c.qs, k.data(), c.ks, v.data(), c.vs, m, a, c.ms, 0.5f, c.divide, -1e9f, true, ratio, true,
                    cpuKey, yc.data(), lc.data());
      const long executesBefore = emu::cudnnExecutes;
      pc::attention(qb.data(), c.qs, kb.data(), c.ks, vb.data(), c.vs, m, a, c.ms, 0.5f, c.divide, -1e9f, true, ratio,
                    true, deviceKey, yg.data(), lg.data());
      cmpBfTol(yc, yg, 1.0 / 128, "y");
      cmp(lc, lg, c.maskKind == 2 ? 1.0 / 256 : 1e-5, "lse");
      if (ratio > 0 && c.vs.v[c.vs.size - 1] == T) { // with v the identity, y is the dropped P: the same zeros
        std::vector<float> identity(c.vs.numel()), pc1(rows * T), l(rows);
        std::vector<bf> pg1(rows * T);
        for (int64_t e = 0; e < c.vs.numel(); ++e) identity[e] = (e / T) % T == e % T ? 1.0f : 0.0f;
        auto identityB = toBf(identity);
        pk::attention(q.data(), c.qs, k.data(), c.ks, identity.data(), c.vs, m, a, c.ms, 0.5f, c.divide, -1e9f, true,
                      ratio, true, cpuKey, pc1.data(), l.data());
        pc::attention(qb.data(), c.qs, kb.data(), c.ks, identityB.data(), c.vs, m, a, c.ms, 0.5f, c.divide, -1e9f,
                      true, ratio, true, deviceKey, pg1.data(), l.data());
        std::vector<uint8_t> zerosC(pc1.size()), zerosG(pg1.size());
        for (size_t e = 0; e < pc1.size(); ++e) zerosC[e] = pc1[e] == 0.0f, zerosG[e] = (float)pg1[e] == 0.0f;
        cmp(zerosC, zerosG, 0, "dropped elements");
      }
      auto dy = randbf(out), yr = roundBf(yc);
      auto dyb = toBf(dy), yb = toBf(yc);
      std::vector<float> dqc(q.size()), dkc(k.size()), dvc(v.size());
      std::vector<bf> dqg(q.size(), bf(NAN)), dkg(k.size(), bf(NAN)), dvg(v.size(), bf(NAN));
      pk::attentionGrad(dy.data(), q.data(), c.qs, k.data(), c.ks, v.data(), c.vs, m, a, c.ms, yr.data(), lc.data(),
                        0.5f, c.divide, -1e9f, true, ratio, true, cpuKey, dqc.data(), dkc.data(), dvc.data());
      pc::attentionGrad(dyb.data(), qb.data(), c.qs, kb.data(), c.ks, vb.data(), c.vs, m, a, c.ms, yb.data(), lg.data(),
                        0.5f, c.divide, -1e9f, true, ratio, true, deviceKey, dqg.data(), dkg.data(), dvg.data());
      cmpBfNormwise(dqc, dqg, kGradTol, "dq");
      cmpBfNormwise(dkc, dkg, kGradTol, "dk");
      cmpBfNormwise(dvc, dvg, kGradTol, "dv");
      ++checks;
      const long executes = emu::cudnnExecutes - executesBefore;
      const long expected = ratio > 0 && c.vs.v[c.vs.size - 1] == T ? 3 : 2;
      if (executes != expected) {
        std::printf("FAIL %s: %ld cuDNN executions, expected %ld\n", ctx.c_str(), executes, expected);
        ++failures;
      }
      // Switched off: pipec's kernels, within the same tolerance of the CPU.
      setenv("PIPEC_CUDNN_ATTENTION", "0", 1);
      std::vector<bf> yo(out, bf(NAN));
      pc::attention(qb.data(), c.qs, kb.data(), c.ks, vb.data(), c.vs, m, a, c.ms, 0.5f, c.divide, -1e9f, true, ratio,
                    true, deviceKey, yo.data(), lg.data());
      unsetenv("PIPEC_CUDNN_ATTENTION");
      cmpBfTol(yc, yo, 1.0 / 128, "y (PIPEC_CUDNN_ATTENTION=0)");
      ++checks;
      if (emu::cudnnExecutes - executesBefore != expected) {
        std::printf("FAIL %s: PIPEC_CUDNN_ATTENTION=0 still ran cuDNN\n", ctx.c_str());
        ++failures;
      }
    }
  // A causal mask declared as such (what generated code does for a constant
  // one, pk::declareCausalMask): cuDNN's causal mode, no bias kernel. With a
  // fill that does not vanish (-1: masked scores are -1, not s·scale - 1),
  // cuDNN cannot take the mask at all: pipec's kernels. `training` as
  // generated code passes it: whether dropout is active, so false without
  // dropout, in the backward too (which must still run on cuDNN).
  for (float fill : {-INFINITY, -1.0f})
    for (float ratio : {0.0f, 0.3f}) {
      const Shape qs{2, 3, 24, 16}, ks{2, 3, 24, 16}, vs{2, 3, 24, 8}, ms{1, 1, 24, 24};
      ctx = std::string("flash attention causal") + (fill < -1e4f ? "" : " fill -1") + (ratio > 0 ? " dropout" : "");
      const bool training = ratio > 0;
      auto q = randbf(qs.numel()), k = randbf(ks.numel()), v = randbf(vs.numel());
      auto qb = toBf(q), kb = toBf(k), vb = toBf(v);
      std::vector<uint8_t> keep(ms.numel()); // 1 where kept (maskedWhen false), as GPT-2 exports it
      for (int64_t e = 0; e < ms.numel(); ++e) keep[e] = e % 24 <= e / 24;
      pc::declareCausalMask(keep.data(), ms, false);
      const int64_t rows = 2 * 3 * 24;
      std::vector<float> yc(rows * 8), lc(rows), lg(rows);
      std::vector<bf> yg(rows * 8, bf(NAN));
      pk::attention(q.data(), qs, k.data(), ks, v.data(), vs, keep.data(), nullptr, ms, 0.25f, false, fill, false,
                    ratio, training, cpuKey, yc.data(), lc.data());
      const long executesBefore = emu::cudnnExecutes;
      const int launchesBefore = emu::launches;
      pc::attention(qb.data(), qs, kb.data(), ks, vb.data(), vs, keep.data(), nullptr, ms, 0.25f, false, fill, false,
                    ratio, training, deviceKey, yg.data(), lg.data());
      cmpBfTol(yc, yg, 1.0 / 128, "y");
      cmp(lc, lg, 1e-5, "lse");
      ++checks;
      const int kernels = emu::launches - launchesBefore;
      const bool causal = fill < -1e4f;
      if (emu::cudnnExecutes - executesBefore != (causal ? 1 : 0) || (kernels == 0) == !causal) {
        std::printf("FAIL %s: %ld cuDNN executions, %d kernel launches\n", ctx.c_str(),
                    emu::cudnnExecutes - executesBefore, kernels);
        ++failures;
      }
      auto dy = randbf(rows * 8), yr = roundBf(yc);
      auto dyb = toBf(dy), yb = toBf(yc);
      std::vector<float> dqc(q.size()), dkc(k.size()), dvc(v.size());
      std::vector<bf> dqg(q.size(), bf(NAN)), dkg(k.size(), bf(NAN)), dvg(v.size(), bf(NAN));
      pk::attentionGrad(dy.data(), q.data(), qs, k.data(), ks, v.data(), vs, keep.data(), nullptr, ms, yr.data(),
                        lc.data(), 0.25f, false, fill, false, ratio, training, cpuKey, dqc.data(), dkc.data(), dvc.data());
      const long gradExecutesBefore = emu::cudnnExecutes;
      pc::attentionGrad(dyb.data(), qb.data(), qs, kb.data(), ks, vb.data(), vs, keep.data(), nullptr, ms, yb.data(),
                        lg.data(), 0.25f, false, fill, false, ratio, training, deviceKey, dqg.data(), dkg.data(),
                        dvg.data());
      if (emu::cudnnExecutes - gradExecutesBefore != (causal ? 1 : 0)) {
        std::printf("FAIL %s: the backward ran cuDNN %ld times, expected %d\n", ctx.c_str(),
                    emu::cudnnExecutes - gradExecutesBefore, causal ? 1 : 0);
        ++failures;
      }
      cmpBfNormwise(dqc, dqg, kGradTol, "dq");
      cmpBfNormwise(dkc, dkg, kGradTol, "dk");
      cmpBfNormwise(dvc, dvg, kGradTol, "dv");
    }
  // Head sizes cuDNN takes no engine for (not multiples of 8): pipec's kernels, no cuDNN execution.
  ctx = "flash attention declined";
  const Shape qs{2, 5, 12}, ks{2, 7, 12}, vs{2, 7, 12};
  auto q = randbf(qs.numel()), k = randbf(ks.numel()), v = randbf(vs.numel());
  std::vector<float> yc(2 * 5 * 12), lc(10), lg(10);
  std::vector<bf> yg(yc.size());
  pk::attention(q.data(), qs, k.data(), ks, v.data(), vs, nullptr, nullptr, Shape{}, 0.5f, false, 0.0f, true, 0.0f,
                true, 0, yc.data(), lc.data());
  const long executesBefore = emu::cudnnExecutes;
  auto qb = toBf(q), kb = toBf(k), vb = toBf(v);
  pc::attention(qb.data(), qs, kb.data(), ks, vb.data(), vs, nullptr, nullptr, Shape{}, 0.5f, false, 0.0f, true, 0.0f,
                true, 0, yg.data(), lg.data());
  cmpBfTol(yc, yg, 1.0 / 128, "y");
  ++checks;
  if (emu::cudnnExecutes != executesBefore) {
    std::printf("FAIL %s: cuDNN ran head size 12\n", ctx.c_str());
    ++failures;
  }
}

/// ReLU6 (ONNX Clip(0, 6)) as batch norm's epilogue (pipec-fuse-norm-epilogue):
/// CUDA against the CPU on float and bf16 storage, training and inference,
/// with a residual wide enough to reach both bounds; the CPU's fused form
/// bit for bit the separate ops, and the bf16 form bit for bit bf16 storage
/// of the separate ops (the bounds are bf16 values, so clamping and
/// rounding commute); the input gradient through it, the masked gradient
/// exactly nn.unary_grad's (0 on both bounds).
static void testBatchNormRelu6() {
  std::mt19937_64 local(6006);
  auto values = [&](int64_t n, float lo, float hi) { return roundBf(uniformValues(local, n, lo, hi)); };
  const pk::Unary relu6 = pk::Unary::Relu6;
  for (const Shape &xs : {Shape{2, 3, 5, 4}, Shape{3, 2, 700}}) {
    const int64_t C = xs.v[1], n = xs.numel();
    const auto x = values(n, -2, 2), r = values(n, -4, 10), dy = values(n, -2, 2), sc = values(C, 0.5f, 2),
               bi = values(C, -1, 1), rm = values(C, -1, 1), rv = values(C, 0.5f, 2);
    for (int training = 0; training < 2; ++training) {
      ctx = "batchNorm relu6 " + xs.str() + " training " + std::to_string(training);
      std::vector<float> yc(n), yg(n), sep(n), nm(C), nv(C), nm2(C), nv2(C);
      pk::batchNorm(x.data(), xs, sc.data(), bi.data(), rm.data(), rv.data(), yc.data(), nm.data(), nv.data(), 1e-5f,
                    0.9f, training, r.data(), relu6);
      pc::batchNorm(x.data(), xs, sc.data(), bi.data(), rm.data(), rv.data(), yg.data(), nm2.data(), nv2.data(), 1e-5f,
                    0.9f, training, r.data(), relu6);
      cmp(yc, yg, 1e-5, "relu6(y + residual)");
      pk::batchNorm(x.data(), xs, sc.data(), bi.data(), rm.data(), rv.data(), sep.data(), nm.data(), nv.data(), 1e-5f,
                    0.9f, training);
      pk::binary(pk::Binary::Add, sep.data(), xs, r.data(), xs, sep.data());
      pk::unary(relu6, sep.data(), n, sep.data());
      cmp(sep, yc, 0, "CPU fused against separate ops");
      int low = 0, high = 0;
      for (float v : yc) low += v == 0.0f, high += v == 6.0f;
      ++checks;
      if (low == 0 || high == 0) std::printf("FAIL %s: the outputs reach a bound of ReLU6 %d/%d times\n", ctx.c_str(), low, high), ++failures;

      // bf16 storage: the fused norm against the separate bf16 ops.
      const auto xb = toBf(x), rb = toBf(r), dyb = toBf(dy);
      std::vector<bf> fusedB(n), sepB(n), sumB(n);
      pc::batchNorm(xb.data(), xs, sc.data(), bi.data(), rm.data(), rv.data(), fusedB.data(), nm2.data(), nv2.data(),
                    1e-5f, 0.9f, training, rb.data(), relu6);
      pc::batchNorm(xb.data(), xs, sc.data(), bi.data(), rm.data(), rv.data(), sepB.data(), nm2.data(), nv2.data(),
                    1e-5f, 0.9f, training, rb.data());
      pc::unary(relu6, sepB.data(), n, sumB.data());
      cmpBf(fromBf(sumB), fusedB, 0, "bf16 relu6 epilogue against relu6 of the bf16 sum");
      cmpBfTol(yc, fusedB, 1.0 / 128 + 1e-4, "bf16 relu6(y + residual) against the CPU");

      // The output as bf16 storage holds it (a value just below 6 rounds to
      // 6 there, and its gradient is then 0 on both sides).
      ctx = "batchNorm gradient through relu6 " + xs.str() + " training " + std::to_string(training);
      const auto y = roundBf(yc);
      std::vector<float> dc(n), dg(n), mc(n), mg(n, NAN), g(n);
      pk::batchNormGrad(dy.data(), x.data(), xs, sc.data(), rm.data(), rv.data(), dc.data(), 1e-5f, training,
                        y.data(), relu6, mc.data());
      pc::batchNormGrad(dy.data(), x.data(), xs, sc.data(), rm.data(), rv.data(), dg.data(), 1e-5f, training,
                        y.data(), relu6, mg.data());
      pk::unaryGrad(relu6, dy.data(), nullptr, y.data(), n, g.data());
      cmp(dc, dg, 1e-4, "dx");
      cmp(mc, mg, 0, "masked dy");
      cmp(g, mc, 0, "masked dy against nn.unary_grad");
      const auto ycb = toBf(y);
      std::vector<bf> dgb(n), mgb(n);
      pc::batchNormGrad(dyb.data(), xb.data(), xs, sc.data(), rm.data(), rv.data(), dgb.data(), 1e-5f, training,
                        ycb.data(), relu6, mgb.data());
      cmpBfNormwise(dc, dgb, 1.0 / 128 + 1e-4, "bf16 dx");
      cmpBf(mc, mgb, 0, "bf16 masked dy");
    }
  }
}


// Convolutional-network kernels beyond convolutions (issue 47), with their
// own generator (the other cases' inputs stay as they were):
//   - batch norm's epilogue (pipec-fuse-norm-epilogue): relu(normalized +
//     residual), training and inference, CUDA against CPU, and the CPU's
//     fused form bit for bit the separate ops; its input gradient through
//     the ReLU, with and without the masked gradient written;
//   - batch norm and pooling on bf16 storage against the CPU float kernels
//     on the same bf16-rounded inputs: results within a bf16 rounding (two
//     for a normalized value, whose statistics come from bf16 inputs), the
//     float statistics and parameter gradients at the float tolerances.
static void testCnnKernels() {
  std::mt19937_64 local(4711);
  auto values = [&](int64_t n, float lo = -2, float hi = 2) { return uniformValues(local, n, lo, hi); };
  auto bfValues = [&](int64_t n) { return roundBf(values(n)); };
  for (const Shape &xs : {Shape{2, 3, 5, 4}, Shape{3, 2, 700}, Shape{1, 4, 1, 1}}) {
    const int64_t C = xs.v[1];
    const auto x = bfValues(xs.numel()), r = bfValues(xs.numel()), dy = bfValues(xs.numel()), sc = values(C),
               bi = values(C), rm = values(C), rv = values(C, 0.5f, 2);
    for (int training = 0; training < 2; ++training) {
      ctx = "batchNorm epilogue " + xs.str() + " training " + std::to_string(training);
      std::vector<float> yc(xs.numel()), yg(xs.numel()), sep(xs.numel()), nm(C), nv(C), nm2(C), nv2(C);
      pk::batchNorm(x.data(), xs, sc.data(), bi.data(), rm.data(), rv.data(), yc.data(), nm.data(), nv.data(), 1e-5f,
                    0.9f, training, r.data(), pk::Unary::Relu);
      pc::batchNorm(x.data(), xs, sc.data(), bi.data(), rm.data(), rv.data(), yg.data(), nm2.data(), nv2.data(), 1e-5f,
                    0.9f, training, r.data(), pk::Unary::Relu);
      cmp(yc, yg, 1e-5, "relu(y + residual)");
      cmp(nm, nm2, 1e-6, "mean");
      pk::batchNorm(x.data(), xs, sc.data(), bi.data(), rm.data(), rv.data(), sep.data(), nm.data(), nv.data(), 1e-5f,
                    0.9f, training);
      pk::binary(pk::Binary::Add, sep.data(), xs, r.data(), xs, sep.data());
      pk::unary(pk::Unary::Relu, sep.data(), xs.numel(), sep.data());
      cmp(sep, yc, 0, "CPU fused against separate ops");
      std::vector<float> yr(xs.numel()), yrg(xs.numel());
      pk::batchNorm(x.data(), xs, sc.data(), bi.data(), rm.data(), rv.data(), yr.data(), nm.data(), nv.data(), 1e-5f,
                    0.9f, training, nullptr, pk::Unary::Relu);
      pc::batchNorm(x.data(), xs, sc.data(), bi.data(), rm.data(), rv.data(), yrg.data(), nm2.data(), nv2.data(),
                    1e-5f, 0.9f, training, nullptr, pk::Unary::Relu);
      cmp(yr, yrg, 1e-5, "relu(y)");
      bool threw = false;
      try {
        pc::batchNorm(x.data(), xs, sc.data(), bi.data(), rm.data(), rv.data(), yrg.data(), nm2.data(), nv2.data(),
                      1e-5f, 0.9f, training, nullptr, pk::Unary::Tanh);
      } catch (const pk::KernelError &) {
        threw = true;
      }
      ++checks;
      if (!threw) std::printf("FAIL %s: an activation other than relu was taken\n", ctx.c_str()), ++failures;

      ctx = "batchNorm gradient through relu " + xs.str() + " training " + std::to_string(training);
      {
        std::vector<float> dc(xs.numel()), dg(xs.numel()), mc(xs.numel()), mg(xs.numel(), NAN), dg2(xs.numel());
        pk::batchNormGrad(dy.data(), x.data(), xs, sc.data(), rm.data(), rv.data(), dc.data(), 1e-5f, training,
                          r.data(), pk::Unary::Relu, mc.data());
        pc::batchNormGrad(dy.data(), x.data(), xs, sc.data(), rm.data(), rv.data(), dg.data(), 1e-5f, training,
                          r.data(), pk::Unary::Relu, mg.data());
        pc::batchNormGrad(dy.data(), x.data(), xs, sc.data(), rm.data(), rv.data(), dg2.data(), 1e-5f, training,
                          r.data(), pk::Unary::Relu);
        cmp(dc, dg, 1e-4, "dx");
        cmp(mc, mg, 0, "masked dy");
        cmp(dg, dg2, 0, "dx without the masked output");
        std::vector<bf> dgb(xs.numel()), mgb(xs.numel());
        const auto dyb = toBf(dy), xb = toBf(x), rb = toBf(r);
        pc::batchNormGrad(dyb.data(), xb.data(), xs, sc.data(), rm.data(), rv.data(), dgb.data(), 1e-5f, training,
                          rb.data(), pk::Unary::Relu, mgb.data());
        cmpBfNormwise(dc, dgb, 1.0 / 128 + 1e-4, "bf16 dx");
        cmpBf(mc, mgb, 0, "bf16 masked dy");
      }

      ctx = "bf16 batchNorm " + xs.str() + " training " + std::to_string(training);
      const auto xb = toBf(x), rb = toBf(r), dyb = toBf(dy);
      std::vector<bf> ybg(xs.numel());
      pc::batchNorm(xb.data(), xs, sc.data(), bi.data(), rm.data(), rv.data(), ybg.data(), nm2.data(), nv2.data(),
                    1e-5f, 0.9f, training, rb.data(), pk::Unary::Relu);
      cmpBfTol(yc, ybg, 1.0 / 128 + 1e-4, "relu(y + residual)");
      pk::batchNorm(x.data(), xs, sc.data(), bi.data(), rm.data(), rv.data(), yc.data(), nm.data(), nv.data(), 1e-5f,
                    0.9f, training);
      pc::batchNorm(xb.data(), xs, sc.data(), bi.data(), rm.data(), rv.data(), ybg.data(), nm2.data(), nv2.data(),
                    1e-5f, 0.9f, training);
      cmpBfTol(yc, ybg, 1.0 / 128 + 1e-4, "y");
      cmp(nm, nm2, 1e-6, "mean");
      cmp(nv, nv2, 1e-6, "var");
      std::vector<float> dc(xs.numel());
      std::vector<bf> dg(xs.numel());
      pk::batchNormGrad(dy.data(), x.data(), xs, sc.data(), rm.data(), rv.data(), dc.data(), 1e-5f, training);
      pc::batchNormGrad(dyb.data(), xb.data(), xs, sc.data(), rm.data(), rv.data(), dg.data(), 1e-5f, training);
      cmpBfNormwise(dc, dg, 1.0 / 128 + 1e-4, "dx");
      std::vector<float> dsc(C), dbc(C), dsg(C), dbg(C);
      pk::batchNormParamGrad(dy.data(), x.data(), xs, rm.data(), rv.data(), dsc.data(), dbc.data(), 1e-5f, training);
      pc::batchNormParamGrad(dyb.data(), xb.data(), xs, rm.data(), rv.data(), dsg.data(), dbg.data(), 1e-5f,
                             training);
      cmp(dsc, dsg, 1e-4, "dscale");
      cmp(dbc, dbg, 1e-5, "dbias");
      auto gs = sc, gb = bi, wantS = sc, wantB = bi;
      pc::batchNormParamGrad(dyb.data(), xb.data(), xs, rm.data(), rv.data(), gs.data(), gb.data(), 1e-5f, training,
                             true);
      for (int64_t c = 0; c < C; ++c) wantS[c] += dsg[c], wantB[c] += dbg[c];
      cmp(wantS, gs, 1e-6, "dscale accumulated");
      cmp(wantB, gb, 1e-6, "dbias accumulated");
    }
  }
  struct Pool {
    Shape xs;
    Dims k, s, p, d;
  };
  for (const Pool &c : {Pool{Shape{2, 3, 7, 6}, Dims{3, 3}, Dims{2, 2}, Dims{1, 1, 1, 1}, Dims{1, 1}},
                        Pool{Shape{1, 2, 9}, Dims{3}, Dims{2}, Dims{1, 0}, Dims{2}}}) {
    for (int ceil = 0; ceil < 2; ++ceil) {
      ctx = "bf16 pooling " + c.xs.str() + " ceil " + std::to_string(ceil);
      const Shape ys = pk::poolOutputShape(c.xs, c.k, c.s, c.p, c.d, ceil);
      const auto x = bfValues(c.xs.numel()), dy = bfValues(ys.numel());
      const auto xb = toBf(x), dyb = toBf(dy);
      std::vector<float> yc(ys.numel()), dc(c.xs.numel());
      std::vector<bf> yg(ys.numel()), dg(c.xs.numel());
      pk::maxPool(x.data(), c.xs, yc.data(), c.k, c.s, c.p, c.d, ceil);
      pc::maxPool(xb.data(), c.xs, yg.data(), c.k, c.s, c.p, c.d, ceil);
      cmpBf(yc, yg, 0, "max y");
      pk::maxPoolGrad(dy.data(), x.data(), c.xs, dc.data(), c.k, c.s, c.p, c.d, ceil);
      pc::maxPoolGrad(dyb.data(), xb.data(), c.xs, dg.data(), c.k, c.s, c.p, c.d, ceil);
      cmpBf(dc, dg, 1, "max dx");
      const Shape as = pk::poolOutputShape(c.xs, c.k, c.s, c.p, Dims{}, ceil);
      const auto ady = bfValues(as.numel());
      const auto adyb = toBf(ady);
      std::vector<float> ac(as.numel()), adc(c.xs.numel());
      std::vector<bf> ag(as.numel()), adg(c.xs.numel());
      pk::averagePool(x.data(), c.xs, ac.data(), c.k, c.s, c.p, ceil, true);
      pc::averagePool(xb.data(), c.xs, ag.data(), c.k, c.s, c.p, ceil, true);
      cmpBf(ac, ag, 1, "average y");
      pk::averagePoolGrad(ady.data(), adc.data(), c.xs, c.k, c.s, c.p, ceil, true);
      pc::averagePoolGrad(adyb.data(), adg.data(), c.xs, c.k, c.s, c.p, ceil, true);
      cmpBf(adc, adg, 1, "average dx");
    }
    ctx = "bf16 global average pool " + c.xs.str();
    const auto x = bfValues(c.xs.numel());
    const auto xb = toBf(x);
    const int64_t planes = c.xs.v[0] * c.xs.v[1];
    std::vector<float> gc(planes);
    std::vector<bf> gg(planes);
    pk::globalAveragePool(x.data(), c.xs, gc.data());
    pc::globalAveragePool(xb.data(), c.xs, gg.data());
    cmpBf(gc, gg, 1, "y");
  }
}

int main(int argc, char **argv) {
  void *fakeStream = (void *)0x5150;
  emu::expectedStream = (cudaStream_t)fakeStream;
  pc::StreamScope scope(fakeStream, pc::Precision::F32);
  std::string only = argc > 1 ? argv[1] : "";
  auto run = [&](const char *name, void (*f)()) {
    if (!only.empty() && only != name) return;
    try { f(); } catch (const std::exception &e) { std::printf("EXCEPTION in %s (%s): %s\n", name, ctx.c_str(), e.what()); ++failures; }
    std::printf("%s done (failures so far %d)\n", name, failures);
    std::fflush(stdout);
  };
  if (only == "mini") run("mini", testMini);
  run("empty", testEmpty);
  run("elementwise", testElementwise);
  run("movement", testMovement);
  run("reduce", testReduce);
  run("reduce2", testReduce2);
  run("softmax", testSoftmax);
  run("norm", testNorm);
  run("rotary", testRotary);
  run("attention", testAttention);
  // Again with blocks of 64 query rows (the default budget holds these
  // cases' scores in one block): several blocks, the bf16 gradients'
  // rounding per block.
  const int64_t attentionBudget = pipec::kernels::plan::cudaAttentionBlockBytes();
  pipec::kernels::plan::cudaAttentionBlockBytes() = 4096;
  run("attention-blocks", testAttention);
  run("bf16-attention-blocks", testBf16Attention);
  pipec::kernels::plan::cudaAttentionBlockBytes() = attentionBudget;
  run("linalg", testLinalg);
  run("conv", testConv);
  run("pool", testPool);
  run("optim", testOptim);
  run("optim-all", testOptimAll);
  run("bf16-type", testBf16Type);
  run("bf16-elementwise", testBf16Elementwise);
  run("bf16-movement", testBf16Movement);
  run("bf16-reduce", testBf16Reduce);
  run("bf16-linalg", testBf16Linalg);
  run("bf16-norm", testBf16Norm);
  run("bf16-softmax", testBf16Softmax);
  run("bf16-attention", testBf16Attention);
  run("flash-attention", testFlashAttention);
  // Last: the others' random inputs as they were.
  run("loss-not-finite", testLossNotFinite);
  run("many-pieces", testManyPieces);
  run("batch-norm-chunks", testBatchNormChunks);
  run("cnn-kernels", testCnnKernels);
  run("bf16-padded-classes", testPaddedClasses);
  run("batch-norm-relu6", testBatchNormRelu6);
  try { pc::raiseDeviceErrors(); } catch (const std::exception &e) { std::printf("device error: %s\n", e.what()); ++failures; }
  std::printf("%d checks, %d failures, %d launches, %lld CUDA threads, %lld fiber switches, %d gemms\n", checks, failures,
              emu::launches, emu::sched().threadsRun, emu::sched().switches, emu::gemmCalls);
  return failures != 0;
}
