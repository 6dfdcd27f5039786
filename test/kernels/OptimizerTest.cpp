#include "TestUtil.h"

using namespace kt;

namespace {

// Reference values (bit-exact): torch 1.13 (.venv), three steps of torch.optim.SGD(lr=0.1,
// momentum=0.9, weight_decay=0.01) and torch.optim.AdamW(lr=0.01,
// betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1) from the same start and
// gradients.
const float kStart[5] = {0.5f, -1.25f, 2.0f, 0.0f, 3.5f};
const float kGrads[3][5] = {{0.1f, -0.2f, 0.3f, 1.0f, -4.0f},
                            {-0.5f, 0.25f, 0.0f, 2.0f, 1.5f},
                            {0.05f, 0.4f, -0.3f, -1.0f, 0.7f}};

TEST(Optimizer, SgdMatchesTorch) {
  float p[5], buf[5];
  std::copy(kStart, kStart + 5, p);
  std::fill(buf, buf + 5, 123.0f); // ignored at step 1
  for (int s = 0; s < 3; ++s) pk::sgdUpdate(p, kGrads[s], buf, 5, s + 1, 0.1f, 0.9f, 0.01f);
  const float torch[5] = {0x1.1ec384p-1f, -0x1.46be84p+0f, 0x1.f006cap+0f, -0x1.19d0aap-1f, 0x1.0d5012p+2f};
  for (int i = 0; i < 5; ++i) EXPECT_EQ(p[i], torch[i]) << i;
  // Momentum 0: plain SGD, the buffer holds the last gradient.
  float q = 1.0f, b = 0.0f;
  const float g = 0.5f;
  pk::sgdUpdate(&q, &g, &b, 1, 4, 0.1f, 0.0f, 0.0f);
  EXPECT_FLOAT_EQ(q, 0.95f);
  EXPECT_EQ(b, 0.5f);
  EXPECT_THROW(pk::sgdUpdate(&q, &g, &b, 1, 0, 0.1f, 0.0f, 0.0f), pk::KernelError);
}

TEST(Optimizer, AdamWMatchesTorch) {
  float p[5], m[5] = {}, v[5] = {};
  std::copy(kStart, kStart + 5, p);
  for (int s = 0; s < 3; ++s) pk::adamwUpdate(p, kGrads[s], m, v, 5, s + 1, 0.01f, 0.9f, 0.999f, 1e-8f, 0.1f);
  const float torch[5] = {0x1.fe7126p-2f, -0x1.3e6168p+0f, 0x1.fa6ab8p+0f, -0x1.865134p-6f, 0x1.c0a0b2p+1f};
  for (int i = 0; i < 5; ++i) EXPECT_EQ(p[i], torch[i]) << i;
}

TEST(Optimizer, AdamWFirstStepIsSignDescent) {
  // At t = 1 the bias-corrected update is lr * g / (|g| + eps) = ±lr.
  float p[3] = {1.0f, 1.0f, 1.0f}, m[3] = {}, v[3] = {};
  const float g[3] = {0.3f, -2.0f, 1e-3f};
  pk::adamwUpdate(p, g, m, v, 3, 1, 0.1f, 0.9f, 0.999f, 1e-8f, 0.0f);
  EXPECT_NEAR(p[0], 0.9f, 1e-6);
  EXPECT_NEAR(p[1], 1.1f, 1e-6);
  EXPECT_NEAR(p[2], 0.9f, 1e-4);
  EXPECT_NEAR(m[1], -0.2f, 1e-7);
  EXPECT_NEAR(v[1], 0.004f, 1e-9); // (1 - beta2) from the double 0.999, as PyTorch
}

} // namespace
