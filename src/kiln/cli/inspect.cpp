// kiln inspect FILE [--json]: what a GGUF file holds, for people and for scripts.
#include <map>
#include <memory>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "kiln/cli/commands.h"
#include "kiln/cli/model_files.h"
#include "kiln/gguf/gguf.h"
#include "kiln/model/arch/arch.h"
#include "kiln/model/hparams.h"

namespace kiln::cli {
namespace {

struct TypeTotal {
  uint64_t num_tensors = 0;
  uint64_t num_elements = 0;
  uint64_t size_bytes = 0;
};

std::string human_bytes(uint64_t n) {
  if (n >= (1ull << 30)) return fmt::format("{:.2f} GiB", static_cast<double>(n) / (1ull << 30));
  if (n >= (1ull << 20)) return fmt::format("{:.2f} MiB", static_cast<double>(n) / (1ull << 20));
  if (n >= (1ull << 10)) return fmt::format("{:.2f} KiB", static_cast<double>(n) / (1ull << 10));
  return fmt::format("{} B", n);
}

std::map<std::string, TypeTotal> totals_by_type(const gguf::File& f) {
  std::map<std::string, TypeTotal> out;
  for (const gguf::TensorInfo& t : f.tensors()) {
    TypeTotal& tt = out[std::string(quant::type_name(t.type))];
    tt.num_tensors++;
    tt.num_elements += static_cast<uint64_t>(t.num_elements());
    tt.size_bytes += t.size_bytes;
  }
  return out;
}

// A token's text for a special-token id key, e.g. "128000 '<|begin_of_text|>'".
std::string special_token(const gguf::File& f, std::string_view key) {
  auto id = f.get_uint(key);
  if (!id.ok()) return "-";
  const gguf::Value* toks = f.find("tokenizer.ggml.tokens");
  const gguf::Array* arr = toks ? toks->as_array() : nullptr;
  if (arr && *id < arr->items.size()) {
    if (const std::string* s = arr->items[*id].as_string()) return fmt::format("{} '{}'", *id, *s);
  }
  return fmt::format("{}", *id);
}

size_t array_len(const gguf::File& f, std::string_view key) {
  const gguf::Value* v = f.find(key);
  return v && v->as_array() ? v->as_array()->items.size() : 0;
}

// The manifest check: "ok" or why the file does not match its architecture.
std::string manifest_status(const gguf::File& f, Expected<model::HParams>& hp) {
  if (!hp.ok()) return hp.error().message;
  const model::ArchDef* arch = model::find_arch(hp->arch);
  if (f.tensors().empty()) return "no tensors (vocab-only file)";
  Status st = model::check_manifest(f, *arch, *hp);
  return st.ok() ? "ok" : st.error().message;
}

void print_text(const gguf::File& f, bool show_all_tensors) {
  fmt::print("file:           {} (GGUF v{}, {}, alignment {})\n", f.path(), f.version(),
             human_bytes(f.size_bytes()), f.alignment());
  auto arch = f.get_string_or("general.architecture", "?");
  auto name = f.get_string_or("general.name", "");
  fmt::print("architecture:   {}\n", arch.ok() ? *arch : "?");
  if (name.ok() && !name->empty()) fmt::print("name:           {}\n", *name);

  auto hp = model::read_hparams(f);
  if (hp.ok()) {
    fmt::print(
        "hyperparams:    vocab {}, ctx {}, embd {}, layers {}, heads {} (kv {}), head_dim {}, "
        "ffn {}, rope base {}, rms eps {}\n",
        hp->n_vocab, hp->n_ctx_train, hp->n_embd, hp->n_layer, hp->n_head, hp->n_head_kv,
        hp->head_dim_k, hp->n_ff, hp->rope_freq_base, hp->rms_eps);
    if (hp->n_expert > 0)
      fmt::print("experts:        {} per layer, {} used, ffn {}\n", hp->n_expert, hp->n_expert_used,
                 hp->n_ff_expert);
    fmt::print("embeddings:     {}\n", hp->tied_embeddings ? "tied" : "separate output");
  }
  if (f.has("tokenizer.ggml.model")) {
    fmt::print("tokenizer:      {} (pre '{}'), {} tokens, {} merges, bos {}, eos {}\n",
               f.get_string_or("tokenizer.ggml.model", "?").value(),
               f.get_string_or("tokenizer.ggml.pre", "default").value(),
               array_len(f, "tokenizer.ggml.tokens"), array_len(f, "tokenizer.ggml.merges"),
               special_token(f, "tokenizer.ggml.bos_token_id"),
               special_token(f, "tokenizer.ggml.eos_token_id"));
  } else {
    fmt::print("tokenizer:      none\n");
  }
  auto tmpl = f.get_string_or("tokenizer.chat_template", "");
  fmt::print("chat template:  {}\n", tmpl.ok() && !tmpl->empty()
                                         ? fmt::format("yes ({})", human_bytes(tmpl->size()))
                                         : "no (ChatML fallback)");
  fmt::print("manifest:       {}\n", manifest_status(f, hp));

  fmt::print("\nmetadata ({} keys):\n", f.metadata().size());
  for (const gguf::KeyValue& kv : f.metadata()) {
    fmt::print("  {:<44} {:<14} {}\n", kv.key, kv.value.type_description(),
               gguf::to_string(kv.value, {.max_array_items = 8, .max_string_bytes = 60}));
  }

  fmt::print("\ntensors ({}):\n", f.tensors().size());
  fmt::print("  {:<36} {:<8} {:<24} {:>12}\n", "name", "type", "shape", "bytes");
  const size_t limit = show_all_tensors ? f.tensors().size() : 64;
  for (size_t i = 0; i < f.tensors().size() && i < limit; ++i) {
    const gguf::TensorInfo& t = f.tensors()[i];
    fmt::print("  {:<36} {:<8} {:<24} {:>12}\n", t.name, quant::type_name(t.type),
               fmt::format("[{}]", fmt::join(t.ne, ", ")), t.size_bytes);
  }
  if (f.tensors().size() > limit)
    fmt::print("  ... {} more (--all to list every tensor)\n", f.tensors().size() - limit);

  fmt::print("\ntotals by type:\n");
  uint64_t elems = 0, bytes = 0;
  for (const auto& [type, tt] : totals_by_type(f)) {
    fmt::print("  {:<8} {:>5} tensors {:>14} params {:>12}\n", type, tt.num_tensors,
               tt.num_elements, human_bytes(tt.size_bytes));
    elems += tt.num_elements;
    bytes += tt.size_bytes;
  }
  fmt::print("  {:<8} {:>5} tensors {:>14} params {:>12}  ({:.2f} bits per weight)\n", "total",
             f.tensors().size(), elems, human_bytes(bytes),
             elems ? 8.0 * static_cast<double>(bytes) / static_cast<double>(elems) : 0.0);
}

nlohmann::json value_json(const gguf::Value& v) {
  if (auto s = v.as_string()) return *s;
  if (auto a = v.as_array()) {
    nlohmann::json arr = nlohmann::json::array();
    for (const gguf::Value& item : a->items) arr.push_back(value_json(item));
    return arr;
  }
  if (auto b = v.as_bool(); b && v.type == gguf::ValueType::kBool) return *b;
  if (v.is_float()) return *v.as_float();
  if (auto u = v.as_uint()) return *u;
  if (auto i = v.as_int()) return *i;
  return nullptr;
}

void print_json(const gguf::File& f, bool full_arrays) {
  nlohmann::json j;
  j["file"] = f.path();
  j["version"] = f.version();
  j["size_bytes"] = f.size_bytes();
  j["alignment"] = f.alignment();
  j["architecture"] = f.get_string_or("general.architecture", "").value();
  auto hp = model::read_hparams(f);
  if (hp.ok()) {
    j["hparams"] = {{"n_vocab", hp->n_vocab},
                    {"n_ctx_train", hp->n_ctx_train},
                    {"n_embd", hp->n_embd},
                    {"n_layer", hp->n_layer},
                    {"n_head", hp->n_head},
                    {"n_head_kv", hp->n_head_kv},
                    {"head_dim", hp->head_dim_k},
                    {"n_ff", hp->n_ff},
                    {"n_expert", hp->n_expert},
                    {"n_expert_used", hp->n_expert_used},
                    {"rope_freq_base", hp->rope_freq_base},
                    {"rms_eps", hp->rms_eps},
                    {"tied_embeddings", hp->tied_embeddings}};
  }
  j["manifest"] = manifest_status(f, hp);
  j["chat_template"] = f.has("tokenizer.chat_template");
  nlohmann::json meta = nlohmann::json::object();
  for (const gguf::KeyValue& kv : f.metadata()) {
    const gguf::Array* a = kv.value.as_array();
    if (a && !full_arrays && a->items.size() > 64) {
      meta[kv.key] = {{"type", kv.value.type_description()}, {"count", a->items.size()}};
    } else {
      meta[kv.key] = value_json(kv.value);
    }
  }
  j["metadata"] = std::move(meta);
  nlohmann::json tensors = nlohmann::json::array();
  for (const gguf::TensorInfo& t : f.tensors()) {
    tensors.push_back({{"name", t.name},
                       {"type", quant::type_name(t.type)},
                       {"shape", t.ne},
                       {"offset", t.offset},
                       {"size_bytes", t.size_bytes}});
  }
  j["tensors"] = std::move(tensors);
  nlohmann::json totals = nlohmann::json::object();
  for (const auto& [type, tt] : totals_by_type(f)) {
    totals[type] = {
        {"tensors", tt.num_tensors}, {"params", tt.num_elements}, {"size_bytes", tt.size_bytes}};
  }
  j["totals_by_type"] = std::move(totals);
  fmt::print("{}\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
}

}  // namespace

RunFn add_inspect(CLI::App& app) {
  auto* cmd = app.add_subcommand("inspect", "Print what a GGUF file holds");
  auto path = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  auto all = std::make_shared<bool>(false);
  cmd->add_option("file", *path, "GGUF file (default: the bundled kiln-tiny, as -m of run)");
  cmd->add_flag("--json", *json, "machine-readable output");
  cmd->add_flag("--all", *all, "list every tensor (text) / every array element (JSON)");
  return [path, json, all]() {
    auto model = model_path_or_default(*path);
    if (!model.ok()) {
      fmt::print(stderr, "kiln inspect: {}\n", model.error().message);
      return 1;
    }
    auto file = gguf::File::open(*model);
    if (!file.ok()) {
      fmt::print(stderr, "kiln inspect: {}\n", file.error().message);
      return 1;
    }
    if (*json) {
      print_json(**file, *all);
    } else {
      print_text(**file, *all);
    }
    return 0;
  };
}

}  // namespace kiln::cli
