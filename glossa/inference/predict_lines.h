// Lines in, JSON lines out through a Predictor: the Marian-decoder / CTranslate2 workflow of
// `glossa predict`. Each input line is one example: a JSON object of its feeds (a string per string
// feed, a number per scalar option), or, for a subgraph with one string feed, a text line.
// Examples run `batch_size` at a time; lines with different options run in separate batches. Each
// output line holds one example's fetches, per-token fetches cut to its length (json_io.h), in
// the input's order. As Marian and CTranslate2 batch: `sort_window` lines are read ahead and
// sorted by length (their string feeds' tokens), so that a batch holds lines of like lengths and
// pads little, and `max_batch_tokens` caps a batch's padded size (rows × its longest line).
//
//   PredictLines(predictor, std::cin, std::cout, {.subgraph = "generate"});
//
// Errors name the input and line (InvalidArgument: bad JSON, an unknown feed, a value of the wrong
// type, a line over max_line_bytes; the Predictor's errors name the batch's last line). A write
// that fails is Aborted naming the output: a run that returns wrote every line.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>

namespace glossa {

class Predictor;

struct PredictLinesOptions {
  std::string subgraph = "default";
  int64_t batch_size = 32;
  // auto: a line starting with '{' is JSON, any other text; text or json: every line.
  std::string input_format = "auto";
  // Lines read ahead and sorted by length before they are cut into batches (Marian's maxi-batch);
  // 0 or 1: batches in input order.
  int64_t sort_window = 0;
  // A batch's rows × its longest line's tokens at most this; 0: no budget. A line longer than the
  // budget runs alone.
  int64_t max_batch_tokens = 0;
  int64_t max_line_bytes = int64_t{1} << 20;
  std::string input_name = "stdin";    // names the input in errors
  std::string output_name = "stdout";  // names the output in errors
};

// Returns the number of lines answered.
int64_t PredictLines(const Predictor& predictor, std::istream& in, std::ostream& out,
                     const PredictLinesOptions& options);

}  // namespace glossa
