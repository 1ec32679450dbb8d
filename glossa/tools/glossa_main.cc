// The `glossa` command-line program.
//
//   glossa list                               # registered classes
//   glossa inspect_params <key>               # a class's params with their docs
//   glossa inspect_params <key> --params_file=f.txt --params_override='dim : 8; act : "RELU"'
//
// Errors print one line naming what was wrong and exit non-zero.
#include <CLI/CLI.hpp>
#include <fstream>
#include <iostream>
#include <sstream>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/core/params.h"
#include "glossa/core/registry.h"

namespace glossa {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw NotFoundError(StrCat("cannot open params file '", path, "'"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// `--params_override` takes `key : value` lines separated by newlines or ';'.
std::string OverrideText(const std::string& s) {
  std::string out = s;
  for (char& c : out) {
    if (c == ';') c = '\n';
  }
  return out;
}

int Run(int argc, char** argv) {
  CLI::App app{"Glossa: build, train, evaluate and serve neural sequence models."};
  app.require_subcommand(1);

  auto* list = app.add_subcommand("list", "List the registered classes.");

  std::string key, params_file, params_override;
  auto* inspect =
      app.add_subcommand("inspect_params", "Print a registered class's params with their docs.");
  inspect->add_option("key", key, "Registry key, e.g. glossa.layers.FeedForward")->required();
  inspect->add_option("--params_file", params_file, "A params text file to apply first.");
  inspect->add_option("--params_override", params_override,
                      "'key : value' lines (';' or newline separated) applied last.");

  CLI11_PARSE(app, argc, argv);

  if (*list) {
    auto keys = ClassRegistry::Keys();
    if (keys.empty()) std::cout << "(no classes registered)\n";
    for (const auto& k : keys) {
      std::cout << k << "  (" << ClassRegistry::Get(k).type_name << ")\n";
    }
    return 0;
  }
  if (*inspect) {
    const auto& entry = ClassRegistry::Get(key);
    if (!entry.default_params) {
      throw FailedPreconditionError(StrCat("class '", key, "' declares no static Params()"));
    }
    Params p = entry.default_params();
    if (!params_file.empty()) {
      try {
        p.FromText(ReadFile(params_file));
      } catch (const Error& e) {
        ThrowError(e.code(), StrCat(params_file, ": ", e.message()));
      }
    }
    if (!params_override.empty()) {
      try {
        p.FromText(OverrideText(params_override));
      } catch (const Error& e) {
        ThrowError(e.code(), StrCat("--params_override: ", e.message()));
      }
    }
    std::cout << p.ToTextWithDocs();
    return 0;
  }
  return 0;
}

}  // namespace
}  // namespace glossa

int main(int argc, char** argv) {
  try {
    return glossa::Run(argc, argv);
  } catch (const glossa::Error& e) {
    std::cerr << "glossa: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "glossa: internal error: " << e.what() << "\n";
    return 2;
  }
}
