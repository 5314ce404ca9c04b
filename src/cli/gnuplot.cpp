// gnuplot as a child process: the script on its standard input, the PNG on its standard
// output. Nothing of gnuplot's goes to disk, so a full disk or a file size limit can only
// fail push train's own (checked) write of the picture, never leave a truncated one.
#include "gnuplot.h"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <iostream>

extern char** environ;

namespace push::cli {
namespace {

/// A PNG is complete when it starts with the signature and ends with the IEND chunk.
bool complete_png(const std::string& png) {
  static const std::string signature("\x89PNG\r\n\x1a\n", 8);
  static const std::string iend("\0\0\0\0IEND\xae\x42\x60\x82", 12);
  return png.size() > signature.size() + iend.size() && png.compare(0, signature.size(), signature) == 0 &&
         png.compare(png.size() - iend.size(), iend.size(), iend) == 0;
}

/// Writes `input` to the child's stdin while reading its stdout, so neither side blocks.
bool exchange(int to_child, int from_child, const std::string& input, std::string& output) {
  size_t written = 0;
  char buffer[65536];
  while (from_child >= 0) {
    pollfd fds[2] = {{from_child, POLLIN, 0}, {to_child, POLLOUT, 0}};
    const nfds_t n = to_child >= 0 ? 2 : 1;
    if (::poll(fds, n, -1) < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (fds[0].revents) {
      const ssize_t got = ::read(from_child, buffer, sizeof(buffer));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) break;
      output.append(buffer, static_cast<size_t>(got));
    }
    if (n == 2 && fds[1].revents) {
      const ssize_t put =
          (fds[1].revents & POLLOUT) ? ::write(to_child, input.data() + written, input.size() - written) : -1;
      if (put < 0 && errno == EINTR) continue;
      if (put > 0) written += static_cast<size_t>(put);
      if (put < 0 || written == input.size()) {
        ::close(to_child);  // gnuplot stopped reading (it failed), or everything is sent
        to_child = -1;
      }
    }
  }
  if (to_child >= 0) ::close(to_child);
  return written == input.size();
}

}  // namespace

std::optional<std::string> render_png(const std::string& name, const std::string& script) {
  auto skip = [&](const std::string& why) -> std::optional<std::string> {
    std::cerr << "push train: " << why << "; skipping " << name << ".png\n";
    return std::nullopt;
  };
  int in[2], out[2];
  if (::pipe2(in, O_CLOEXEC) != 0) return skip(std::string("cannot run gnuplot: ") + std::strerror(errno));
  if (::pipe2(out, O_CLOEXEC) != 0) {
    ::close(in[0]);
    ::close(in[1]);
    return skip(std::string("cannot run gnuplot: ") + std::strerror(errno));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in[0], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  char* argv[] = {const_cast<char*>("gnuplot"), nullptr};
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, "gnuplot", &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(in[0]);
  ::close(out[1]);
  if (rc != 0) {
    ::close(in[1]);
    ::close(out[0]);
    return skip(rc == ENOENT ? std::string("gnuplot not found")
                             : std::string("cannot run gnuplot: ") + std::strerror(rc));
  }
  // A gnuplot that exits early must not kill us with SIGPIPE.
  struct sigaction ignore {
  }, previous{};
  ignore.sa_handler = SIG_IGN;
  ::sigaction(SIGPIPE, &ignore, &previous);
  std::string png;
  const std::string input =
      "set terminal pngcairo size 900,560 font 'sans,11'\nset output\n"
      "set key outside top center horizontal\nset grid\n" +
      script;
  const bool sent = exchange(in[1], out[0], input, png);
  ::close(out[0]);
  ::sigaction(SIGPIPE, &previous, nullptr);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!sent || !WIFEXITED(status) || WEXITSTATUS(status) != 0 || !complete_png(png)) return skip("gnuplot failed");
  return png;
}

}  // namespace push::cli
