// kiln's Jinja against Python's Jinja2 on real chat templates: tests/oracle/jinja/render.py
// writes the expected renderings (cases.json) into the build dir; this test renders the same
// templates and conversations and compares byte for byte. Where Jinja2 raised, kiln must fail
// too (and with the same text for raise_exception). Skipped when the expectations are absent
// (run `ctest -R jinja_oracle` or the render.py script first).
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <gtest/gtest.h>

#include "kiln/chat/template.h"

namespace {

using nlohmann::ordered_json;

std::string oracle_dir() {
  if (const char* env = std::getenv("KILN_JINJA_ORACLE_DIR")) return env;
  return std::string(KILN_BINARY_DIR) + "/jinja_oracle";
}

// Templates known to differ from Jinja2, with the construct at fault. Every other template
// must match on every conversation.
const std::map<std::string, std::string>& known_failures() {
  static const std::map<std::string, std::string> k = {};
  return k;
}

struct Outcome {
  int num_cases = 0;
  int num_match = 0;
  std::string first_diff;
};

std::string first_difference(const std::string& want, const std::string& got) {
  size_t i = 0;
  while (i < want.size() && i < got.size() && want[i] == got[i]) ++i;
  size_t from = i > 40 ? i - 40 : 0;
  return "at byte " + std::to_string(i) +
         ":\n  python: " + ordered_json(want.substr(from, 120)).dump() +
         "\n  kiln:   " + ordered_json(got.substr(from, 120)).dump();
}

TEST(JinjaOracle, RealTemplatesMatchPythonJinja2) {
  std::ifstream in(oracle_dir() + "/cases.json");
  if (!in) {
    GTEST_SKIP() << "no oracle expectations in " << oracle_dir();
  }
  ordered_json doc = ordered_json::parse(in);
  kiln::chat::ChatOptions base;
  base.bos_token = doc["bos_token"];
  base.eos_token = doc["eos_token"];
  std::tm now{};
  auto n = doc["now"];
  now.tm_year = n[0].get<int>() - 1900;
  now.tm_mon = n[1].get<int>() - 1;
  now.tm_mday = n[2].get<int>();
  now.tm_hour = n[3].get<int>();
  now.tm_min = n[4].get<int>();
  now.tm_sec = n[5].get<int>();
  std::mktime(&now);  // fills tm_wday / tm_yday for %a, %A, %j
  now.tm_hour = n[3].get<int>();
  base.now = now;

  std::map<std::string, Outcome> outcomes;
  for (const auto& c : doc["results"]) {
    std::string tname = c["template"];
    std::string cname = c["conversation"];
    const auto& conv = doc["conversations"][cname];
    kiln::chat::ChatOptions opts = base;
    if (conv.contains("tools")) opts.tools = conv["tools"];
    opts.add_generation_prompt = conv.value("add_generation_prompt", true);
    if (conv.contains("chat_template_kwargs"))
      opts.chat_template_kwargs = conv["chat_template_kwargs"];
    auto got =
        kiln::chat::render_chat(doc["templates"][tname].get<std::string>(), conv["messages"], opts);
    Outcome& o = outcomes[tname];
    ++o.num_cases;
    std::string diff;
    if (c.contains("error")) {
      std::string want = c["error"];
      if (std::getenv("KILN_JINJA_ORACLE_VERBOSE") && !got.ok()) {
        std::printf("both raise: %s x %s\n  python: %s\n  kiln:   %s\n", tname.c_str(),
                    cname.c_str(), want.c_str(), got.error().message.c_str());
      }
      if (got.ok()) {
        diff = "python raised (" + want + ") but kiln rendered";
      } else if (want.rfind("TemplateError: ", 0) == 0 &&
                 got.error().message.find(want.substr(15)) == std::string::npos) {
        diff = "raise_exception message differs: python '" + want + "', kiln '" +
               got.error().message + "'";
      }
    } else if (!got.ok()) {
      diff = "kiln failed: " + got.error().message;
    } else if (*got != c["output"].get<std::string>()) {
      diff = first_difference(c["output"], *got);
    }
    if (diff.empty()) {
      ++o.num_match;
    } else if (o.first_diff.empty()) {
      o.first_diff = cname + ": " + diff;
    }
  }
  int num_full = 0, num_real = 0;
  std::ostringstream report;
  for (const auto& [tname, o] : outcomes) {
    bool full = o.num_match == o.num_cases;
    bool real = tname.rfind("feature-", 0) != 0;  // feature-*: our own language tests
    num_real += real;
    num_full += full && real;
    report << (full ? "  ok   " : "  FAIL ") << tname << " " << o.num_match << "/" << o.num_cases;
    if (!full) report << "\n         " << o.first_diff;
    report << "\n";
    bool known = known_failures().count(tname) > 0;
    if (!known) {
      EXPECT_TRUE(full) << tname << ": " << o.first_diff;
    }
  }
  std::printf("jinja oracle: %d of %d real templates identical on every conversation\n%s", num_full,
              num_real, report.str().c_str());
  EXPECT_GE(num_full, 25);
}

}  // namespace
