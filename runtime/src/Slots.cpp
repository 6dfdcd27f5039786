#include "Slots.h"

namespace pipec::rt {

SlotPool::SlotPool(Device &device, Transport &transport)
    : device_(device), transport_(transport), gpu_(!device.host()) {}

SlotPool::~SlotPool() {
  if (!gpu_) return;
  // Normally drained by the end of the run; after a start-up error nothing
  // is in flight.
  for (auto &cs : chunks_)
    for (auto &s : cs.slots)
      for (Event e : {s->ready, s->outputsDone, s->gradInputsDone, s->dataStaged, s->inputsIn, s->gradOutputsIn})
        if (e) device_.deleteEvent(e);
}

void SlotPool::addChunk(const StageModel &model, bool firstStage) {
  ChunkSlots cs;
  cs.model = &model;
  cs.firstStage = firstStage;
  cs.scratchOutputs = Buffer(device_, model.outputLayout().total);
  cs.scratchWorkspace = Buffer(device_);
  chunks_.push_back(std::move(cs));
}

Slot &SlotPool::get(int chunk, int mb, bool create) {
  ChunkSlots &cs = chunks_[chunk];
  auto it = cs.active.find(mb);
  if (it != cs.active.end()) return *it->second;
  if (!create)
    throw Error("micro-batch " + std::to_string(mb) + " has no state on chunk " + std::to_string(chunk) +
                " (no FWD or RECV_ACT before)");
  Slot *s;
  if (!cs.freeSlots.empty()) {
    s = cs.freeSlots.back();
    cs.freeSlots.pop_back();
  } else {
    auto fresh = std::make_unique<Slot>();
    const StageModel &m = *cs.model;
    for (Buffer *b : {&fresh->data, &fresh->inputs, &fresh->outputs, &fresh->gradOutputs, &fresh->gradInputs})
      *b = Buffer(device_);
    fresh->data.resize(m.dataLayout().total);
    if (m.desc().num_inputs) fresh->inputs.resize(m.inputLayout().total), fresh->gradInputs.resize(m.inputLayout().total);
    if (m.desc().num_outputs) fresh->outputs.resize(m.outputLayout().total), fresh->gradOutputs.resize(m.outputLayout().total);
    if (gpu_) {
      fresh->dataStage = HostBuffer(device_, m.dataLayout().total);
      for (Event *e : {&fresh->ready, &fresh->outputsDone, &fresh->gradInputsDone, &fresh->dataStaged, &fresh->inputsIn,
                       &fresh->gradOutputsIn})
        *e = device_.newEvent();
    }
    s = fresh.get();
    cs.slots.push_back(std::move(fresh));
  }
  s->mb = mb;
  s->dataLoaded = s->haveInputs = s->haveGradOutputs = s->fwdDone = s->bDone = s->wDone = s->gradHandedOff = false;
  if (gpu_) {
    // The new micro-batch's writers (compute, receives) wait until the sends
    // of the previous one left the buffers; `ready` marks that point (and the
    // allocation of a fresh slot) on the compute stream.
    for (Transport::Request r : s->sends) {
      device_.streamWait(nullptr, transport_.event(r));
      transport_.release(r);
    }
    device_.record(s->ready);
    s->inputsReceived = s->gradOutputsReceived = false;
  }
  s->sends.clear();
  cs.active[mb] = s;
  return *s;
}

std::unique_ptr<Buffer> SlotPool::takeWorkspace(int chunk) {
  ChunkSlots &cs = chunks_[chunk];
  if (!cs.freeWorkspaces.empty()) {
    auto w = std::move(cs.freeWorkspaces.back());
    cs.freeWorkspaces.pop_back();
    return w;
  }
  return std::make_unique<Buffer>(device_, (size_t)cs.model->desc().workspace_bytes);
}

void SlotPool::maybeRelease(int chunk, Slot &s) {
  ChunkSlots &cs = chunks_[chunk];
  if (!s.wDone || !(cs.firstStage || s.gradHandedOff)) return;
  if (!gpu_) { // CUDA: the sends stay with the slot (see get())
    for (auto r : s.sends) transport_.wait(r);
    s.sends.clear();
  }
  if (s.workspace) cs.freeWorkspaces.push_back(std::move(s.workspace));
  cs.active.erase(s.mb);
  cs.freeSlots.push_back(&s);
}

void *SlotPool::scratchWorkspace(int chunk) {
  ChunkSlots &cs = chunks_[chunk];
  const size_t bytes = (size_t)cs.model->desc().workspace_bytes;
  if (cs.scratchWorkspace.size() != bytes) cs.scratchWorkspace.resize(bytes);
  return cs.scratchWorkspace.data();
}

int SlotPool::firstActive(int chunk) const {
  const ChunkSlots &cs = chunks_[chunk];
  return cs.active.empty() ? -1 : cs.active.begin()->first;
}

void SlotPool::waitSends() {
  for (auto &cs : chunks_)
    for (auto &s : cs.slots) {
      for (Transport::Request r : s->sends) transport_.wait(r);
      s->sends.clear();
    }
}

} // namespace pipec::rt
