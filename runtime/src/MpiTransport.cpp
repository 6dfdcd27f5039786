#include "MpiTransport.h"

#include "Plan.h" // Error

#include <cassert>
#include <climits>

namespace pipec::rt {

void checkMpi(int rc, const char *what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw Error(std::string(what) + " failed: " + std::string(msg, len));
}

namespace {

MPI_Datatype mpiType(pipec_dtype t) {
  switch (t) {
  case PIPEC_F32: return MPI_FLOAT;
  case PIPEC_F64: return MPI_DOUBLE;
  case PIPEC_I64: return MPI_INT64_T;
  case PIPEC_I32: return MPI_INT32_T;
  default: throw Error("all-reduce of an unsupported dtype");
  }
}
} // namespace

MpiControl::MpiControl() {
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  // Errors come back as codes and become exceptions with a message naming
  // the rank (instead of OpenMPI's generic abort).
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  // The node-local rank (collective: every rank constructs a control first).
  MPI_Comm local = MPI_COMM_NULL;
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local) == MPI_SUCCESS &&
      local != MPI_COMM_NULL) {
    MPI_Comm_rank(local, &localRank_);
    MPI_Comm_size(local, &localSize_);
    MPI_Comm_free(&local);
  }
}
MpiControl::~MpiControl() {
  if (stage_ != MPI_COMM_NULL) MPI_Comm_free(&stage_);
  for (MPI_Comm &c : groups_) MPI_Comm_free(&c);
}
void MpiControl::barrier() { checkMpi(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }
void MpiControl::allreduceSumWorld(double *v, int n) {
  checkMpi(MPI_Allreduce(MPI_IN_PLACE, v, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
}
void MpiControl::allreduceSumStage(double *v, int n) {
  checkMpi(MPI_Allreduce(MPI_IN_PLACE, v, n, MPI_DOUBLE, MPI_SUM, stage_), "MPI_Allreduce (stage)");
}
void MpiControl::allreduceMaxWorld(int64_t *v, int n) {
  checkMpi(MPI_Allreduce(MPI_IN_PLACE, v, n, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce");
}
std::vector<int64_t> MpiControl::allgather(const std::vector<int64_t> &mine) {
  std::vector<int64_t> all(mine.size() * size_);
  checkMpi(MPI_Allgather(mine.data(), (int)mine.size(), MPI_INT64_T, all.data(), (int)mine.size(), MPI_INT64_T,
                      MPI_COMM_WORLD),
        "MPI_Allgather");
  return all;
}
std::vector<std::string> MpiControl::gatherToRoot(const std::string &mine) {
  int len = (int)mine.size();
  std::vector<int> lens(size_), displs(size_);
  checkMpi(MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, MPI_COMM_WORLD), "MPI_Gather");
  std::string all;
  if (rank_ == 0) {
    size_t total = 0;
    for (int r = 0; r < size_; ++r) displs[r] = (int)total, total += lens[r];
    all.resize(total);
  }
  checkMpi(MPI_Gatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, 0, MPI_COMM_WORLD),
        "MPI_Gatherv");
  std::vector<std::string> out;
  if (rank_ == 0)
    for (int r = 0; r < size_; ++r) out.push_back(all.substr(displs[r], lens[r]));
  return out;
}
std::vector<std::string> MpiControl::allgatherStrings(const std::string &mine) {
  int len = (int)mine.size();
  std::vector<int> lens(size_), displs(size_);
  checkMpi(MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, MPI_COMM_WORLD), "MPI_Allgather");
  size_t total = 0;
  for (int r = 0; r < size_; ++r) displs[r] = (int)total, total += lens[r];
  std::string all(total, '\0');
  checkMpi(MPI_Allgatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, MPI_COMM_WORLD),
        "MPI_Allgatherv");
  std::vector<std::string> out;
  for (int r = 0; r < size_; ++r) out.push_back(all.substr(displs[r], lens[r]));
  return out;
}
void MpiControl::splitStage(int color) {
  checkMpi(MPI_Comm_split(MPI_COMM_WORLD, color, rank_, &stage_), "MPI_Comm_split");
  MPI_Comm_set_errhandler(stage_, MPI_ERRORS_RETURN);
}
int MpiControl::splitGroup(bool member) {
  MPI_Comm c = MPI_COMM_NULL;
  checkMpi(MPI_Comm_split(MPI_COMM_WORLD, member ? 0 : MPI_UNDEFINED, rank_, &c), "MPI_Comm_split (group)");
  if (!member) return -1;
  MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
  groups_.push_back(c);
  return (int)groups_.size() - 1;
}
MPI_Comm MpiControl::groupComm(int group) const {
  assert(group >= 0 && group < (int)groups_.size() && "group ids come from splitGroup");
  return groups_[group];
}
void MpiControl::abort(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code); // not reached
}

MpiTransport::~MpiTransport() {
  for (auto &[id, r] : pending_) MPI_Cancel(&r);
}
int64_t MpiTransport::maxTag() const {
  void *v = nullptr;
  int flag = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &v, &flag);
  return flag ? *(int *)v : 32767;
}
MpiTransport::Request MpiTransport::add(MPI_Request r) {
  pending_[next_] = r;
  return next_++;
}
MpiTransport::Request MpiTransport::isend(const void *buf, size_t bytes, int peer, int tag) {
  if (bytes > (size_t)INT_MAX) throw Error("message of " + std::to_string(bytes) + " bytes exceeds MPI's int count");
  MPI_Request r;
  checkMpi(MPI_Isend(buf, (int)bytes, MPI_BYTE, peer, tag, MPI_COMM_WORLD, &r), "MPI_Isend");
  return add(r);
}
MpiTransport::Request MpiTransport::irecv(void *buf, size_t bytes, int peer, int tag) {
  if (bytes > (size_t)INT_MAX) throw Error("message of " + std::to_string(bytes) + " bytes exceeds MPI's int count");
  MPI_Request r;
  checkMpi(MPI_Irecv(buf, (int)bytes, MPI_BYTE, peer, tag, MPI_COMM_WORLD, &r), "MPI_Irecv");
  const Request id = add(r);
  expect_[id] = bytes;
  return id;
}
void MpiTransport::wait(Request id) {
  auto it = pending_.find(id);
  assert(it != pending_.end() && "a request is waited on once, after isend or irecv returned it");
  MPI_Status st;
  const int rc = MPI_Wait(&it->second, &st);
  pending_.erase(it);
  checkMpi(rc, "MPI_Wait");
  if (auto e = expect_.find(id); e != expect_.end()) {
    int got = 0;
    MPI_Get_count(&st, MPI_BYTE, &got);
    const size_t want = e->second;
    expect_.erase(e);
    if ((size_t)got != want)
      throw Error("received " + std::to_string(got) + " bytes from rank " + std::to_string(st.MPI_SOURCE) +
                  ", expected " + std::to_string(want) + " (the neighbouring stages disagree on the tensor sizes)");
  }
}
void MpiTransport::allreduceSumStage(void *buf, size_t count, pipec_dtype dtype, Stream) {
  if (count > (size_t)INT_MAX) throw Error("all-reduce of more than INT_MAX elements");
  checkMpi(MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, mpiType(dtype), MPI_SUM, control_.stageComm()),
        "MPI_Allreduce (gradients)");
}

} // namespace pipec::rt

namespace pipec::rt {
void MpiTransport::allreduceSumGroup(int group, void *buf, size_t count, pipec_dtype dtype) {
  // Reduce to the group's first rank, then broadcast: MPI_Allreduce may sum
  // in a different order on different ranks, and tied copies must stay
  // bitwise equal.
  if (count > (size_t)INT_MAX) throw Error("all-reduce of more than INT_MAX elements");
  const MPI_Comm comm = control_.groupComm(group);
  int me = 0;
  MPI_Comm_rank(comm, &me);
  checkMpi(MPI_Reduce(me == 0 ? MPI_IN_PLACE : buf, me == 0 ? buf : nullptr, (int)count, mpiType(dtype), MPI_SUM, 0, comm),
        "MPI_Reduce (tied gradients)");
  checkMpi(MPI_Bcast(buf, (int)count, mpiType(dtype), 0, comm), "MPI_Bcast (tied gradients)");
}
} // namespace pipec::rt
