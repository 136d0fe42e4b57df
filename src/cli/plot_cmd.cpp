// `plot METRICS.jsonl --out loss.svg`: the loss curve a person can look at. SVG rather than TensorBoard event
// files: one self-contained file any browser shows, no protobuf/CRC writer and no TensorBoard install to read
// it (docs/trainer.md "Progress and metrics"). Two panels over the step axis: training loss (and eval loss
// where the run measured it), and the learning rate.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "cli_common.h"
#include "qwen3/base/error.h"
#include "qwen3/base/file_io.h"
#include "qwen3/dat/durable_file.h"

namespace qwen3::cli {
namespace {

struct Series {
  std::string name, color;
  std::vector<std::pair<double, double>> points;  // (step, value)
};

struct Range {
  double lo = std::numeric_limits<double>::infinity(), hi = -std::numeric_limits<double>::infinity();
  void add(double v) { lo = std::min(lo, v), hi = std::max(hi, v); }
  void widen() {  // a flat series still gets a band to sit in
    if (!(hi > lo)) lo -= 0.5 * (std::fabs(lo) + 1), hi += 0.5 * (std::fabs(hi) + 1);
  }
};

// Reads step, loss, eval_loss and lr; a line that is not a JSON object with a numeric step is an error naming it.
std::vector<Series> read_metrics(const std::string& path) {
  std::ifstream in = open_input_file(path, "metrics");
  Series loss{"loss", "#1f77b4", {}}, eval{"eval_loss", "#d62728", {}}, lr{"lr", "#2ca02c", {}};
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const nlohmann::json m = nlohmann::json::parse(line, nullptr, false);
    if (m.is_discarded() || !m.is_object() || !m.contains("step") || !m["step"].is_number())
      throw Error(fmt::format("{}:{}: not a metrics line (a JSON object with a \"step\")", path, n));
    const double step = m["step"].get<double>();
    const auto add = [&](Series& s, const char* key) {
      if (m.contains(key) && m[key].is_number() && std::isfinite(m[key].get<double>()))
        s.points.emplace_back(step, m[key].get<double>());
    };
    add(loss, "loss"), add(eval, "eval_loss"), add(lr, "lr");
  }
  if (loss.points.empty()) throw Error(path + ": no step with a finite loss to plot");
  return {loss, eval, lr};
}

std::string number(double v) {
  if (v == 0) return "0";
  const double a = std::fabs(v);
  return a >= 1e4 || a < 1e-3 ? fmt::format("{:.2g}", v) : fmt::format("{:.4g}", v);
}

// One panel: axes with five ticks each, the series as polylines (and dots when they are few).
void panel(std::string& svg, double top, double height, const Range& steps, const std::vector<const Series*>& series,
           const std::string& title) {
  const double left = 70, width = 620;
  Range values;
  for (const Series* s : series)
    for (const auto& [x, y] : s->points) values.add(y);
  values.widen();
  const auto X = [&](double x) { return left + (x - steps.lo) / (steps.hi - steps.lo) * width; };
  const auto Y = [&](double y) { return top + height - (y - values.lo) / (values.hi - values.lo) * height; };
  svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#999\"/>\n", left, top,
                     width, height);
  svg += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"13\">{}</text>\n", left, top - 6, title);
  for (int i = 0; i <= 4; ++i) {
    const double x = steps.lo + (steps.hi - steps.lo) * i / 4, y = values.lo + (values.hi - values.lo) * i / 4;
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"10\" text-anchor=\"middle\">{}</text>\n", X(x),
                       top + height + 14, number(std::round(x)));
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"10\" text-anchor=\"end\">{}</text>\n", left - 4,
                       Y(y) + 3, number(y));
    svg += fmt::format("<line x1=\"{0}\" x2=\"{1}\" y1=\"{2:.1f}\" y2=\"{2:.1f}\" stroke=\"#eee\"/>\n", left,
                       left + width, Y(y));
  }
  double legend = left + 8;
  for (const Series* s : series) {
    if (s->points.empty()) continue;
    std::string points;
    for (const auto& [x, y] : s->points) points += fmt::format("{:.2f},{:.2f} ", X(x), Y(y));
    points.pop_back();
    svg += fmt::format("<polyline class=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\" points=\"{}\"/>\n",
                       s->name, s->color, points);
    if (s->points.size() <= 50)
      for (const auto& [x, y] : s->points)
        svg += fmt::format("<circle cx=\"{:.2f}\" cy=\"{:.2f}\" r=\"2\" fill=\"{}\"/>\n", X(x), Y(y), s->color);
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"11\" fill=\"{}\">{}</text>\n", legend, top + 14,
                       s->color, s->name);
    legend += 80;
  }
}

std::string render_svg(const std::vector<Series>& series, const std::string& title) {
  Range steps;
  for (const Series& s : series)
    for (const auto& [x, y] : s.points) steps.add(x);
  steps.widen();
  std::string svg =
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"720\" height=\"560\" viewBox=\"0 0 720 560\" "
      "font-family=\"sans-serif\">\n<rect width=\"720\" height=\"560\" fill=\"white\"/>\n";
  // The title is the file name: escaped, it is the only text from outside.
  std::string escaped;
  for (char c : title) escaped += c == '<' ? "&lt;" : c == '>' ? "&gt;" : c == '&' ? "&amp;" : std::string(1, c);
  svg += fmt::format("<text x=\"360\" y=\"22\" font-size=\"15\" text-anchor=\"middle\">{}</text>\n", escaped);
  panel(svg, 50, 280, steps, {&series[0], &series[1]}, "loss (per step) and eval loss");
  panel(svg, 400, 120, steps, {&series[2]}, "learning rate");
  svg += "<text x=\"380\" y=\"550\" font-size=\"11\" text-anchor=\"middle\">step</text>\n</svg>\n";
  return svg;
}

}  // namespace

Command add_plot_command(CLI::App& app) {
  struct Options {
    std::string metrics, out;
    bool overwrite = false;
  };
  auto o = std::make_shared<Options>();
  auto* sub = app.add_subcommand("plot", "Draw a run's metrics (train loss, eval loss, learning rate) as an SVG");
  sub->add_option("metrics", o->metrics, "the run's --metrics-jsonl file")->required();
  sub->add_option("--out", o->out, "the SVG to write")->required();
  add_bool_flag(sub, "--overwrite", o->overwrite, "replace an existing --out");
  return {sub, [o]() {
            if (!o->overwrite && std::ifstream(o->out).good())
              throw UsageError("plot: --out " + o->out + " exists; pass --overwrite to replace it");
            const std::vector<Series> series = read_metrics(o->metrics);
            write_file_durably(o->out, render_svg(series, o->metrics));
            fmt::print("plotted {} steps ({} with eval loss) to {}\n", series[0].points.size(), series[1].points.size(),
                       o->out);
            return 0;
          }};
}

}  // namespace qwen3::cli
