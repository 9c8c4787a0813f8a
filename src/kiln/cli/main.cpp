// kiln: the command and its subcommands.
#include <cstdio>
#include <string_view>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: kiln <command> [args]\n");
    return 2;
  }
  std::fprintf(stderr, "kiln: unknown command '%s'\n", argv[1]);
  return 2;
}
