// MPI implementations of Control and Transport (host memory).
#pragma once

#include "Transport.h"

#include <mpi.h>

#include <unordered_map>
#include <vector>

namespace pipec::rt {

// Throws Error("WHAT failed: <MPI's message>") unless rc is MPI_SUCCESS.
void checkMpi(int rc, const char *what);

class MpiControl : public Control {
public:
  MpiControl();
  ~MpiControl() override;
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  // Rank among the ranks of this node (MPI_COMM_TYPE_SHARED): picks the GPU.
  int localRank() const { return localRank_; }
  int localSize() const { return localSize_; }
  void barrier() override;
  void allreduceSumWorld(double *v, int n) override;
  void allreduceSumStage(double *v, int n) override;
  void allreduceMaxWorld(int64_t *v, int n) override;
  std::vector<int64_t> allgather(const std::vector<int64_t> &mine) override;
  std::vector<std::string> gatherToRoot(const std::string &mine) override;
  std::vector<std::string> allgatherStrings(const std::string &mine) override;
  void splitStage(int color) override;
  int splitGroup(bool member) override;
  [[noreturn]] void abort(int code) override;
  MPI_Comm stageComm() const { return stage_; }
  MPI_Comm groupComm(int group) const;

private:
  int rank_ = 0, size_ = 1, localRank_ = 0, localSize_ = 1;
  MPI_Comm stage_ = MPI_COMM_NULL;
  std::vector<MPI_Comm> groups_; // splitGroup, by handle
};

class MpiTransport : public Transport {
public:
  explicit MpiTransport(const MpiControl &control) : control_(control) {}
  ~MpiTransport() override;
  const char *name() const override { return "mpi"; }
  int64_t maxTag() const override;
  Request isend(const void *buf, size_t bytes, int peer, int tag) override;
  Request irecv(void *buf, size_t bytes, int peer, int tag) override;
  void wait(Request r) override;
  void allreduceSumStage(void *buf, size_t count, pipec_dtype dtype, Stream stream = nullptr) override;
  void allreduceSumGroup(int group, void *buf, size_t count, pipec_dtype dtype) override;

private:
  Request add(MPI_Request r);
  const MpiControl &control_;
  std::unordered_map<Request, MPI_Request> pending_;
  std::unordered_map<Request, size_t> expect_; // receives: bytes expected
  Request next_ = 1;
};

} // namespace pipec::rt
