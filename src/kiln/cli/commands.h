// The kiln subcommands. Each adds itself to the CLI11 app and returns what to run if chosen.
// Exit codes: 0 success, 1 failure (bad file, I/O), 2 usage error.
#pragma once

#include <functional>

#include <CLI/CLI.hpp>

namespace kiln::cli {

using RunFn = std::function<int()>;

RunFn add_inspect(CLI::App& app);
RunFn add_make_model(CLI::App& app);
RunFn add_convert(CLI::App& app);
RunFn add_tokenize(CLI::App& app);
RunFn add_template(CLI::App& app);
RunFn add_run(CLI::App& app);
RunFn add_bench(CLI::App& app);
// `kiln bench http` (bench_http.cpp), a subcommand of `kiln bench`: sets *chosen (was it on
// the command line?) and *run.
void add_bench_http(CLI::App& bench, std::function<bool()>* chosen, RunFn* run);
RunFn add_serve(CLI::App& app);
RunFn add_perplexity(CLI::App& app);
RunFn add_doctor(CLI::App& app);

}  // namespace kiln::cli
