// kiln: the command and its subcommands.
#include <cstdio>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kiln/backend/backend.h"
#include "kiln/backend/cpu/matmul.h"
#include "kiln/cli/commands.h"
#include "kiln/util/cpu.h"
#include "kiln/util/log.h"

#ifndef KILN_VERSION
#define KILN_VERSION "unknown"
#endif
#ifndef KILN_GIT_COMMIT
#define KILN_GIT_COMMIT "unknown"
#endif
#ifndef KILN_BUILD_TYPE
#define KILN_BUILD_TYPE "unknown"
#endif

namespace {

void print_version() {
  namespace cpu = kiln::backend::cpu;
  std::string paths;
  for (cpu::KernelPath p :
       {cpu::KernelPath::Scalar, cpu::KernelPath::Avx2, cpu::KernelPath::Avx512}) {
    if (!cpu::path_available(p)) continue;
    paths += (paths.empty() ? "" : ", ") + std::string(cpu::path_name(p));
  }
  fmt::print("kiln {} (commit {}, {} build)\n", KILN_VERSION, KILN_GIT_COMMIT, KILN_BUILD_TYPE);
  fmt::print("cpu kernels: {} (using {})\n", paths, cpu::path_name(cpu::best_kernel_path()));
  fmt::print("cpu features: {}\n", kiln::util::to_string(kiln::util::cpu_features()));
  fmt::print("cuda: {}\n", kiln::backend::cuda_compiled() ? "compiled in" : "not compiled in");
}

// The first word of the command line that is not an option of `kiln` itself.
std::string_view first_command_word(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--log-level") {
      ++i;  // its value
      continue;
    }
    if (a == "--version" || a == "-h" || a == "--help" || a.starts_with("--log-level=")) continue;
    if (a.starts_with("-")) return {};  // not kiln's own option: CLI11 reports it
    return a;
  }
  return {};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kiln: LLM inference engine and server"};
  app.require_subcommand(0, 1);
  // Options of `kiln` itself (--log-level) are accepted after the subcommand too.
  app.fallthrough();
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "debug, info, warn, error or off")
      ->capture_default_str();
  bool version = false;
  app.add_flag("--version", version, "print the version, commit, build type, CPU kernels, CUDA");

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

  // An unknown command: say so and list the commands (CLI11 would only say "not expected").
  if (const std::string_view word = first_command_word(argc, argv); !word.empty()) {
    bool known = false;
    std::string names;
    for (const auto& [sub, run] : commands) {
      known = known || sub->get_name() == word;
      names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    if (!known) {
      fmt::print(stderr, "kiln: unknown command '{}'; the commands are: {}\n(kiln --help)\n", word,
                 names);
      return 2;
    }
  }

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
  if (version) {
    print_version();
    return 0;
  }
  for (auto& [sub, run] : commands) {
    if (sub->parsed()) return run();
  }
  // Bare `kiln`: the help.
  std::fputs(app.help().c_str(), stdout);
  return 0;
}
