// Device memory that another process can open, for the emulation's CUDA IPC
// (cuda_runtime.h's cudaIpc* calls; the emulated piperun of
// test/runtime's piperun_emulated runs several ranks on one emulated GPU). With
// PIPEC_EMU_IPC=1 every cudaMalloc allocation is a shared mapping of its own
// memory file, and its handle names the owning process and file; without
// it, cudaIpcGetMemHandle fails, as on machines that refuse IPC; with
// PIPEC_EMU_IPC=2 cudaIpcOpenMemHandle does.
#pragma once
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

namespace emu {
// PIPEC_EMU_IPC=2: handles are made but another process cannot open them
// (as where processes do not share an IPC namespace).
inline const int ipcMode = [] {
  const char *v = std::getenv("PIPEC_EMU_IPC");
  return v ? std::atoi(v) : 0;
}();
inline const bool shareable = ipcMode >= 1;
struct SharedMapping {
  int fd = -1; // -1: opened from another process
  size_t bytes = 0;
};
inline std::mutex sharedLock;
inline std::map<void *, SharedMapping> &sharedMappings() {
  static auto *m = new std::map<void *, SharedMapping>;
  return *m;
}
struct SharedHandle {
  int64_t pid, fd;
  uint64_t bytes;
};
inline void *sharedAllocate(size_t n) {
  const size_t bytes = n ? n : 1;
  const int fd = memfd_create("pipec-emulated-device", 0);
  if (fd < 0) return nullptr;
  if (ftruncate(fd, (off_t)bytes) != 0) return close(fd), nullptr;
  void *p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return close(fd), nullptr;
  std::lock_guard<std::mutex> hold(sharedLock);
  sharedMappings()[p] = {fd, bytes};
  return p;
}
// Unmaps an allocation of sharedAllocate or sharedOpen; false for other memory.
inline bool sharedUnmap(void *p, bool opened) {
  std::lock_guard<std::mutex> hold(sharedLock);
  auto it = sharedMappings().find(p);
  if (it == sharedMappings().end() || (it->second.fd < 0) != opened) return false;
  munmap(p, it->second.bytes);
  if (it->second.fd >= 0) close(it->second.fd);
  sharedMappings().erase(it);
  return true;
}
inline bool sharedFree(void *p) { return sharedUnmap(p, false); }
inline bool sharedClose(void *p) { return sharedUnmap(p, true); }
inline bool sharedHandle(void *p, char *handle, size_t capacity) {
  std::lock_guard<std::mutex> hold(sharedLock);
  auto it = sharedMappings().find(p);
  if (it == sharedMappings().end() || it->second.fd < 0 || capacity < sizeof(SharedHandle)) return false;
  const SharedHandle h{(int64_t)getpid(), it->second.fd, it->second.bytes};
  std::memset(handle, 0, capacity);
  std::memcpy(handle, &h, sizeof h);
  return true;
}
inline void *sharedOpen(const char *handle) {
  if (ipcMode == 2) return nullptr;
  SharedHandle h;
  std::memcpy(&h, handle, sizeof h);
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%lld/fd/%lld", (long long)h.pid, (long long)h.fd);
  const int fd = open(path, O_RDWR);
  if (fd < 0) return nullptr;
  void *p = mmap(nullptr, h.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return nullptr;
  std::lock_guard<std::mutex> hold(sharedLock);
  sharedMappings()[p] = {-1, h.bytes};
  return p;
}
} // namespace emu
