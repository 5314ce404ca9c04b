#include "dist/rendezvous/secret_file.h"

#include <push/core/errors.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "dist/c10d.h"

namespace push::dist::detail::secret_file {
namespace {

constexpr const char* kOrigin = "push::dist::World";
constexpr const char* kHowInstead =
    "give every rank the same PUSH_JOB_SECRET (export PUSH_JOB_SECRET=$(openssl rand -hex 32)) or start the job "
    "with push launch";

/// Why `st` (from lstat or fstat) is not private to this user; empty when it is.
std::string not_private(const struct stat& st) {
  if (st.st_uid != ::geteuid()) return c10::str("it belongs to uid ", st.st_uid, ", not this user (", ::geteuid(), ")");
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return c10::str("its mode ", mode, " lets other users in");
  }
  return "";
}

/// `dir` made (mode 0700) if missing, and checked: a folder of this user's, private to it.
void private_folder(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    throw Error(c10::str("[", kOrigin, "] cannot make the folder ", dir,
                         " for the job's secret: ", std::strerror(errno), "; ", kHowInstead));
  }
  struct stat st {};
  PUSH_CHECK(::lstat(dir.c_str(), &st) == 0, kOrigin, "cannot inspect ", dir, ": ", std::strerror(errno));
  PUSH_CHECK(S_ISDIR(st.st_mode), kOrigin, dir,
             " is not a folder (a link or a file another user may have put there): ", "remove it, or ", kHowInstead);
  const std::string why = not_private(st);
  PUSH_CHECK(why.empty(), kOrigin, "the folder ", dir, " for the job's secret is not private: ", why,
             "; remove it, or ", kHowInstead);
}

/// $XDG_RUNTIME_DIR when it is this user's private folder (systemd makes it so), else "".
std::string runtime_dir() {
  const char* dir = std::getenv("XDG_RUNTIME_DIR");
  if (dir == nullptr || dir[0] != '/') return "";
  struct stat st {};
  if (::lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode) || !not_private(st).empty()) return "";
  return dir;
}

}  // namespace

std::string path_for(const std::string& master_addr, int port, const std::string& job_id) {
  const std::string runtime = runtime_dir();
  const std::string dir = runtime.empty() ? c10::str("/tmp/push-", ::geteuid()) : runtime + "/push";
  private_folder(dir);
  // A name from the job's address and id (hashed: MASTER_ADDR and the id may hold any byte).
  const handshake::Bytes name = handshake::hmac(handshake::Bytes{}, c10::str(master_addr, "\n", port, "\n", job_id));
  return c10::str(dir, "/job-", handshake::to_hex(name).substr(0, 32), ".secret");
}

void write(const std::string& path, const handshake::Bytes& secret) {
  const std::string temporary =
      c10::str(path, ".", ::getpid(), ".", handshake::to_hex(handshake::random_bytes()).substr(0, 8));
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  PUSH_CHECK(fd >= 0, kOrigin, "cannot write the job's secret to ", temporary, ": ", std::strerror(errno), "; ",
             kHowInstead);
  const std::string text = handshake::to_hex(secret) + "\n";
  const bool written = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  const int error = errno;
  ::close(fd);
  if (!written || ::rename(temporary.c_str(), path.c_str()) != 0) {
    const int why = written ? errno : error;
    ::unlink(temporary.c_str());
    throw Error(c10::str("[", kOrigin, "] cannot write the job's secret to ", path, ": ", std::strerror(why), "; ",
                         kHowInstead));
  }
}

std::optional<handshake::Bytes> try_read(const std::string& path) {
  const std::string cannot = c10::str("rank 0 drew the job's secret into ", path, ", which this rank cannot use: ");
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0 && errno == ENOENT) return std::nullopt;
  PUSH_CHECK(fd >= 0, kOrigin, cannot, std::strerror(errno), "; ", kHowInstead);
  struct stat st {};
  const bool stated = ::fstat(fd, &st) == 0;
  std::string why = !stated                ? std::string(std::strerror(errno))
                    : !S_ISREG(st.st_mode) ? std::string("not a regular file")
                                           : not_private(st);
  char text[2 * handshake::kBytes + 2] = {};
  ssize_t n = 0;
  if (why.empty()) {
    n = ::read(fd, text, sizeof(text));
    if (n != static_cast<ssize_t>(2 * handshake::kBytes + 1) || text[2 * handshake::kBytes] != '\n') {
      why = "it does not hold 64 hexadecimal digits";
    }
  }
  ::close(fd);
  PUSH_CHECK(why.empty(), kOrigin, cannot, why, "; ", kHowInstead);
  return handshake::from_hex(std::string(text, 2 * handshake::kBytes), path.c_str());
}

handshake::Bytes read(const std::string& path, const std::string& fingerprint) {
  const std::string cannot = c10::str("rank 0 drew the job's secret into ", path, ", which this rank cannot use: ");
  const auto secret = try_read(path);
  PUSH_CHECK(secret.has_value(), kOrigin, cannot, std::strerror(ENOENT),
             " (is this rank on another host than rank 0?); ", kHowInstead);
  PUSH_CHECK(handshake::fingerprint(*secret) == fingerprint, kOrigin, cannot,
             "it holds another secret than rank 0's (a file of an earlier job?); ", kHowInstead);
  return *secret;
}

}  // namespace push::dist::detail::secret_file
