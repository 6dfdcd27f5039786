// compare_weights A B [--rtol X --atol Y] [--differs-from DIR]
// Compares every stage_<k>.bin in directory A with B (same tensors, shapes,
// values within atol + rtol*|b|). --differs-from checks that A is not equal
// to DIR (the initial weights), so a run that trained nothing cannot pass.
#include "pipec/tensor_file.h"

#include <cmath>
#include <filesystem>
#include <iostream>
#include <map>

namespace fs = std::filesystem;
using pipec::io::Tensor;

// A name in several stage files is a tied parameter: its copies must be
// bitwise equal (the runtime gives every holder the same summed gradient).
static std::map<std::string, Tensor> readDir(const std::string &dir) {
  std::map<std::string, Tensor> all;
  for (const auto &e : fs::directory_iterator(dir))
    if (e.path().extension() == ".bin")
      for (Tensor &t : pipec::io::readTensorFile(e.path().string())) {
        auto it = all.find(t.name);
        if (it != all.end()) {
          if (it->second.shape != t.shape || it->second.data != t.data)
            throw std::runtime_error(dir + ": the copies of tied parameter " + t.name + " differ between stage files");
          std::cout << "compare_weights: " << dir << ": tied copies of " << t.name << " are equal\n";
        }
        all[t.name] = std::move(t);
      }
  if (all.empty()) throw std::runtime_error(dir + ": no tensors (*.bin)");
  return all;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    std::cerr << "usage: compare_weights A B [--rtol X] [--atol Y] [--differs-from DIR]\n";
    return 2;
  }
  double rtol = 1e-5, atol = 1e-6;
  std::string initial;
  for (int i = 3; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--rtol") rtol = std::stod(argv[++i]);
    else if (a == "--atol") atol = std::stod(argv[++i]);
    else if (a == "--differs-from") initial = argv[++i];
  }
  try {
    const auto A = readDir(argv[1]), B = readDir(argv[2]);
    if (A.size() != B.size()) throw std::runtime_error("different tensor counts");
    double worst = 0;
    int bad = 0;
    for (const auto &[name, a] : A) {
      auto it = B.find(name);
      if (it == B.end()) throw std::runtime_error("tensor " + name + " missing in " + argv[2]);
      const Tensor &b = it->second;
      if (a.shape != b.shape || a.dtype != PIPEC_F32 || b.dtype != PIPEC_F32) throw std::runtime_error("tensor " + name + ": shape or dtype differ");
      const float *x = (const float *)a.data.data(), *y = (const float *)b.data.data();
      for (size_t k = 0; k < a.data.size() / 4; ++k) {
        const double d = std::fabs((double)x[k] - y[k]);
        worst = std::max(worst, d);
        if (!(d <= atol + rtol * std::fabs((double)y[k]))) {
          if (bad++ < 5) std::cerr << name << "[" << k << "]: " << x[k] << " vs " << y[k] << "\n";
        }
      }
    }
    std::cout << "compare_weights: " << A.size() << " tensors, max |diff| " << worst << "\n";
    if (bad) {
      std::cerr << "compare_weights: " << bad << " values differ beyond tolerance\n";
      return 1;
    }
    if (!initial.empty()) {
      const auto I = readDir(initial);
      double moved = 0;
      for (const auto &[name, a] : A) {
        const float *x = (const float *)a.data.data(), *y = (const float *)I.at(name).data.data();
        for (size_t k = 0; k < a.data.size() / 4; ++k) moved = std::max(moved, std::fabs((double)x[k] - y[k]));
      }
      std::cout << "compare_weights: max change from the initial weights " << moved << "\n";
      if (moved < 1e-4) {
        std::cerr << "compare_weights: the weights did not train\n";
        return 1;
      }
    }
  } catch (const std::exception &e) {
    std::cerr << "compare_weights: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
