// kiln convert: a Hugging Face checkpoint folder -> GGUF.
#include <memory>

#include <fmt/format.h>

#include "kiln/cli/commands.h"
#include "kiln/model/convert/hf_to_gguf.h"

namespace kiln::cli {

RunFn add_convert(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "convert", "Convert a Hugging Face checkpoint (config.json + safetensors) to GGUF");
  auto o = std::make_shared<model::ConvertOptions>();
  auto out = std::make_shared<std::string>();
  cmd->add_option("dir", o->hf_dir, "folder with config.json, *.safetensors, tokenizer.json")
      ->required();
  cmd->add_option("--type", o->type,
                  "f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q4_k q5_k q6_k q4_k_m q5_k_m")
      ->capture_default_str();
  cmd->add_option("-o,--output", *out, "output .gguf path")->required();
  return [o, out]() {
    Status st = model::convert_hf_file(*o, *out);
    if (!st.ok()) {
      fmt::print(stderr, "kiln convert: {}\n", st.error().message);
      return 1;
    }
    fmt::print(stderr, "kiln convert: wrote {}\n", *out);
    return 0;
  };
}

}  // namespace kiln::cli
