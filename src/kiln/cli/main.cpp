// kiln: the command and its subcommands.
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "kiln/cli/commands.h"
#include "kiln/util/log.h"

int main(int argc, char** argv) {
  CLI::App app{"kiln: LLM inference engine and server"};
  app.require_subcommand(1);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "debug, info, warn, error or off")
      ->capture_default_str();

  std::vector<std::pair<CLI::App*, kiln::cli::RunFn>> commands;
  auto add = [&](kiln::cli::RunFn (*fn)(CLI::App&)) {
    const size_t before = app.get_subcommands({}).size();
    kiln::cli::RunFn run = fn(app);
    commands.emplace_back(app.get_subcommands({})[before], std::move(run));
  };
  add(kiln::cli::add_inspect);
  add(kiln::cli::add_make_model);
  add(kiln::cli::add_convert);
  add(kiln::cli::add_tokenize);
  add(kiln::cli::add_template);
  add(kiln::cli::add_run);
  add(kiln::cli::add_bench);
  add(kiln::cli::add_serve);
  add(kiln::cli::add_perplexity);
  add(kiln::cli::add_doctor);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  if (!kiln::log::set_level(log_level)) {
    std::fprintf(stderr, "kiln: unknown --log-level '%s'\n", log_level.c_str());
    return 2;
  }
  for (auto& [sub, run] : commands) {
    if (sub->parsed()) return run();
  }
  return 2;
}
