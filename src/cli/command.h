#pragma once
// Subcommands of the `push` tool register themselves; main() dispatches on argv[1].
//   PUSH_CLI_COMMAND(train, "train a distribution on built-in or CSV data", train_main);
#include <functional>
#include <map>
#include <string>

namespace push::cli {

struct Command {
  std::string summary;
  std::function<int(int argc, char** argv)> run;  // argv[0] is the subcommand's name
};

std::map<std::string, Command>& commands();

struct Registrar {
  Registrar(const std::string& name, std::string summary, std::function<int(int, char**)> run) {
    commands()[name] = Command{std::move(summary), std::move(run)};
  }
};

}  // namespace push::cli

#define PUSH_CLI_COMMAND(name, summary, fn) static ::push::cli::Registrar push_cli_registrar_##name(#name, summary, fn)
