#include "checkpoint/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace shardwise::checkpoint {
namespace {

void write_all(int fd, const char* data, size_t size, const std::string& where) {
  while (size > 0) {
    const ssize_t written = ::write(fd, data, size);
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) throw std::runtime_error(where + " failed: " + std::strerror(errno));
    data += written;
    size -= static_cast<size_t>(written);
  }
}

void fsync_folder(const std::string& path) {
  const size_t slash = path.rfind('/');
  const std::string folder = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  const int fd = ::open(folder.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;  // not every filesystem allows it; the rename itself is atomic
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

void atomic_write(const std::string& path,
                  const std::vector<std::pair<const void*, size_t>>& parts,
                  const std::string& what) {
  const std::string temporary = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    throw std::runtime_error(what + ": cannot create '" + temporary + "': " + std::strerror(errno) +
                             "; check that the folder exists and is "
                             "writable");
  }
  try {
    for (const auto& [data, size] : parts) {
      write_all(fd, static_cast<const char*>(data), size, what + ": writing '" + temporary + "'");
    }
    if (::fsync(fd) != 0) {
      throw std::runtime_error(what + ": flushing '" + temporary +
                               "' failed: " + std::strerror(errno));
    }
  } catch (...) {
    ::close(fd);
    ::unlink(temporary.c_str());
    throw;
  }
  ::close(fd);
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    ::unlink(temporary.c_str());
    throw std::runtime_error(what + ": cannot move the saved file to '" + path + "': " + reason);
  }
  fsync_folder(path);
}

}  // namespace shardwise::checkpoint
