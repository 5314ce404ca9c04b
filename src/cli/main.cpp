// push: the command-line tool. `push <command> [options]`; `push help` lists commands.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <string>

#include "command.h"
#include "core/user_text.h"

namespace push::cli {

std::map<std::string, Command>& commands() {
  static std::map<std::string, Command> registry;
  return registry;
}

}  // namespace push::cli

int main(int argc, char** argv) {
  auto& commands = push::cli::commands();
  auto usage = [&](std::ostream& out) {
    out << "usage: push <command> [options]\ncommands:\n";
    for (const auto& [name, command] : commands) out << "  " << name << "  " << command.summary << "\n";
  };
  if (argc < 2 || std::string(argv[1]) == "help" || std::string(argv[1]) == "--help") {
    usage(argc < 2 ? std::cerr : std::cout);
    return argc < 2 ? 2 : 0;
  }
  auto it = commands.find(argv[1]);
  if (it == commands.end()) {
    std::cerr << "push: unknown command '" << push::detail::printable(argv[1]) << "'\n";
    usage(std::cerr);
    return 2;
  }
  try {
    const int status = it->second.run(argc - 1, argv + 1);
    // What the command printed must have reached its reader: a full disk or a closed pipe
    // behind stdout is a failure, not a run that exits 0 with its results lost.
    std::cout.flush();
    errno = 0;
    const bool flushed = std::fflush(stdout) == 0;
    const int error = errno;
    if (!flushed || std::ferror(stdout) != 0 || std::cout.fail()) {
      std::cerr << "push " << argv[1] << ": cannot write to standard output"
                << (error != 0 ? std::string(": ") + std::strerror(error) : std::string())
                << " (what it printed there is lost)\n";
      return status == 0 ? 1 : status;
    }
    return status;
  } catch (const std::exception& e) {
    // One line, whatever the message quotes (a path with a newline or an escape sequence),
    // and one prefix: "push train: x", not "push train: [push train] x".
    std::string message = e.what();
    const std::string own = "[push " + std::string(argv[1]) + "] ";
    if (message.rfind(own, 0) == 0) message.erase(0, own.size());
    std::cerr << "push " << argv[1] << ": " << push::detail::printable(message, std::string::npos) << "\n";
    // The command's own objects are gone (unwound: staging folders removed, lanes and
    // ranks joined). Skip the libraries' exit-time teardown: under an address-space limit
    // OpenBLAS's threads retry a failed allocation forever, and its teardown waits for
    // them, so the process printed its one line and then never ended.
    std::cout.flush();
    std::cerr.flush();
    std::fflush(nullptr);
    std::_Exit(1);
  }
}
