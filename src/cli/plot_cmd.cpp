// `plot METRICS.jsonl [MORE.jsonl ...] --out loss.svg`: the loss curves a person can look at, one self-contained
// SVG any browser shows (TensorBoard: train --tensorboard). Two panels over the step axis: the training loss (per
// step, faint, under its moving average) and the eval loss where measured; the learning rate. One color a run.
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "cli_common.h"
#include "qwen3/base/error.h"
#include "qwen3/base/file_io.h"
#include "qwen3/dat/durable_file.h"
#include "qwen3/export/output_target.h"

namespace qwen3::cli {
namespace {

struct Series {
  std::string name, color;
  std::vector<std::pair<double, double>> points;  // (step, value)
  double opacity = 1, width = 1.5;
  bool dashed = false;
};

// One run's curves: the per-step loss, the eval loss where measured, the learning rate.
struct Run {
  std::string label;
  Series loss, eval, lr;
};

struct Range {
  double lo = std::numeric_limits<double>::infinity(), hi = -std::numeric_limits<double>::infinity();
  void add(double v) { lo = std::min(lo, v), hi = std::max(hi, v); }
  // A flat series (a constant learning rate) sits in a band around its value, not on a ±0.5 axis.
  void widen() {
    if (hi > lo) return;
    const double v = lo, half = v == 0 ? 1 : 0.5 * std::fabs(v);
    lo = v - half, hi = v + half;
  }
};

// Axis ticks at 1, 2 or 5 times a power of ten, at most about six, the range extended to whole ticks.
struct Ticks {
  double lo, hi, step;
  std::vector<double> values;
};
Ticks nice_ticks(double lo, double hi, double min_step = 0) {
  const double span = hi - lo, rough = span / 5;
  const double power = std::pow(10.0, std::floor(std::log10(rough)));
  double step = power * 10;
  for (double m : {1.0, 2.0, 5.0})
    if (power * m >= rough) {
      step = power * m;
      break;
    }
  step = std::max(step, min_step);
  Ticks t{std::floor(lo / step + 1e-9) * step, std::ceil(hi / step - 1e-9) * step, step, {}};
  for (double v = t.lo; v <= t.hi + step * 1e-6; v += step) t.values.push_back(std::fabs(v) < step * 1e-9 ? 0 : v);
  return t;
}

// A tick's text: as many decimals as its step needs, scientific below 1e-3 or from 1e5.
std::string tick_text(double v, double step) {
  if (v == 0) return "0";
  const double a = std::fabs(v);
  if (a < 1e-3 || a >= 1e5) return fmt::format("{:.2g}", v);
  const int decimals = std::max(0, static_cast<int>(-std::floor(std::log10(step) + 1e-9)));
  return fmt::format("{:.{}f}", v, decimals);
}

// Reads step, loss, eval_loss and lr; a line that is not a JSON object with a numeric step is an error naming it,
// but an unfinished last line (a run writing it now, or killed while writing it), which is skipped with a warning.
// A step at or before the one above it is a restart (metrics from before resumes removed the records a resume
// trains again, or files joined by hand): as TensorBoard does at a restart, the points of that step and later
// read so far are dropped, with a warning, so that each step is drawn once, from its newest record.
Run read_metrics(const std::string& path, const std::string& color) {
  std::ifstream in = open_input_file(path, "metrics");
  const std::filesystem::path p(path);
  const std::string folder = p.parent_path().filename().string();
  Run run{folder.empty() || p.filename() != "metrics.jsonl" ? p.filename().string() : folder,
          {"loss", color, {}},
          {"eval_loss", color, {}},
          {"lr", color, {}}};
  std::string line;
  double last_step = -std::numeric_limits<double>::infinity();
  int64_t restarts = 0, dropped = 0;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const bool unfinished = in.eof();  // no line break after it: the file ends inside this line
    const nlohmann::json m = nlohmann::json::parse(line, nullptr, false);
    if (m.is_discarded() && unfinished) {
      spdlog::warn("plot: {}:{}: an unfinished last line (a run writing it, or stopped while it wrote): skipped",
                   path, n);
      break;
    }
    if (m.is_discarded() || !m.is_object() || !m.contains("step") || !m["step"].is_number())
      throw Error(fmt::format("{}:{}: not a metrics line (a JSON object with a \"step\")", path, n));
    const double step = m["step"].get<double>();
    if (step <= last_step) {
      ++restarts;
      const auto at_or_after = [&](const std::pair<double, double>& p) { return p.first >= step; };
      dropped += std::count_if(run.loss.points.begin(), run.loss.points.end(), at_or_after);
      for (Series* s : {&run.loss, &run.eval, &run.lr})
        s->points.erase(std::remove_if(s->points.begin(), s->points.end(), at_or_after), s->points.end());
    }
    last_step = step;
    const auto add = [&](Series& s, const char* key) {
      if (m.contains(key) && m[key].is_number() && std::isfinite(m[key].get<double>()))
        s.points.emplace_back(step, m[key].get<double>());
    };
    add(run.loss, "loss"), add(run.eval, "eval_loss"), add(run.lr, "lr");
  }
  if (restarts > 0)
    spdlog::warn("plot: {}: its steps start again {} time(s) (a run resumed before its records were cut back); the "
                 "{} earlier record(s) of the repeated steps are not drawn", path, restarts, dropped);
  if (run.loss.points.empty()) throw Error(path + ": no step with a finite loss to plot");
  run.eval.dashed = true;
  return run;
}

// TensorBoard's smoothing: an exponential moving average with weight w on the past, debiased at the start.
Series smoothed(const Series& raw, double w) {
  Series out = raw;
  double ema = 0, weight = 0;
  for (auto& [x, y] : out.points) {
    ema = w * ema + (1 - w) * y;
    weight = w * weight + (1 - w);
    y = ema / weight;
  }
  return out;
}

std::string escaped(const std::string& text) {
  std::string out;
  for (char c : text) out += c == '<' ? "&lt;" : c == '>' ? "&gt;" : c == '&' ? "&amp;" : std::string(1, c);
  return out;
}

// One panel: 1-2-5 ticks on both axes, the series as polylines (and dots when they are few and drawn solid).
void panel(std::string& svg, double top, double height, const Ticks& steps, const std::vector<const Series*>& series,
           const std::string& title) {
  const double left = 70, width = 620;
  Range range;
  for (const Series* s : series)
    for (const auto& [x, y] : s->points) range.add(y);
  range.widen();
  // A margin, so that no curve runs along the frame (two constant learning rates would sit on its edges).
  // Not below zero for values that never are (a loss, a learning rate).
  const double margin = 0.05 * (range.hi - range.lo);
  const double lo = range.lo >= 0 ? std::max(0.0, range.lo - margin) : range.lo - margin;
  const Ticks values = nice_ticks(lo, range.hi + margin);
  const auto X = [&](double x) { return left + (x - steps.lo) / (steps.hi - steps.lo) * width; };
  const auto Y = [&](double y) { return top + height - (y - values.lo) / (values.hi - values.lo) * height; };
  svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#999\"/>\n", left, top,
                     width, height);
  svg += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"13\">{}</text>\n", left, top - 6, title);
  for (double x : steps.values)
    svg += fmt::format("<text class=\"xtick\" x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"10\" text-anchor=\"middle\">{}</text>\n",
                       X(x), top + height + 14, tick_text(x, steps.step));
  for (double y : values.values) {
    svg += fmt::format("<text class=\"ytick\" x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"10\" text-anchor=\"end\">{}</text>\n",
                       left - 4, Y(y) + 3, tick_text(y, values.step));
    svg += fmt::format("<line x1=\"{0}\" x2=\"{1}\" y1=\"{2:.1f}\" y2=\"{2:.1f}\" stroke=\"#eee\"/>\n", left,
                       left + width, Y(y));
  }
  for (const Series* s : series) {
    if (s->points.empty()) continue;
    std::string points;
    for (const auto& [x, y] : s->points) points += fmt::format("{:.2f},{:.2f} ", X(x), Y(y));
    points.pop_back();
    svg += fmt::format("<polyline class=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"{}\" stroke-opacity=\"{}\"{} "
                       "points=\"{}\"/>\n",
                       s->name, s->color, s->width, s->opacity, s->dashed ? " stroke-dasharray=\"5,3\"" : "", points);
    if (s->points.size() <= 50 && s->opacity == 1)
      for (const auto& [x, y] : s->points)
        svg += fmt::format("<circle cx=\"{:.2f}\" cy=\"{:.2f}\" r=\"2\" fill=\"{}\"/>\n", X(x), Y(y), s->color);
  }
}

std::string render_svg(std::vector<Run> runs, double smoothing) {
  Range step_range;
  for (const Run& r : runs)
    for (const Series* s : {&r.loss, &r.eval, &r.lr})
      for (const auto& [x, y] : s->points) step_range.add(x);
  step_range.widen();
  const Ticks steps = nice_ticks(step_range.lo, step_range.hi, /*min_step=*/1);
  std::string svg =
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"720\" height=\"580\" viewBox=\"0 0 720 580\" "
      "font-family=\"sans-serif\">\n<rect width=\"720\" height=\"580\" fill=\"white\"/>\n";
  // Run labels come from file names: escaped, they are the only text from outside.
  const std::string title = runs.size() == 1 ? runs[0].label : fmt::format("{} runs", runs.size());
  svg += fmt::format("<text x=\"360\" y=\"22\" font-size=\"15\" text-anchor=\"middle\">{}</text>\n", escaped(title));
  // The per-step loss faint behind its moving average; the eval loss dashed with its points.
  std::vector<Series> loss_curves;
  for (Run& r : runs) {
    Series raw = r.loss;
    raw.name = "loss_raw", raw.opacity = 0.25, raw.width = 1;
    loss_curves.push_back(raw);
    loss_curves.push_back(smoothed(r.loss, smoothing));
  }
  std::vector<const Series*> top, bottom;
  for (const Series& s : loss_curves) top.push_back(&s);
  for (const Run& r : runs) top.push_back(&r.eval), bottom.push_back(&r.lr);
  panel(svg, 50, 280, steps,
        top, fmt::format("loss: per step (faint), moving average (weight {:g}), eval loss (dashed)", smoothing));
  panel(svg, 400, 120, steps, bottom, "learning rate");
  svg += "<text x=\"380\" y=\"550\" font-size=\"11\" text-anchor=\"middle\">step</text>\n";
  if (runs.size() > 1) {
    double x = 70;
    for (const Run& r : runs) {
      svg += fmt::format("<text class=\"legend\" x=\"{:.1f}\" y=\"570\" font-size=\"11\" fill=\"{}\">{}</text>\n", x,
                         r.loss.color, escaped(r.label));
      x += 14 + 7.0 * static_cast<double>(r.label.size());
    }
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace

Command add_plot_command(CLI::App& app) {
  struct Options {
    std::vector<std::string> metrics;
    std::string out;
    double smoothing = 0.6;
    bool overwrite = false;
  };
  auto o = std::make_shared<Options>();
  auto* sub = app.add_subcommand("plot", "Draw runs' metrics (train loss, eval loss, learning rate) as an SVG");
  sub->add_option("metrics", o->metrics,
                  "the runs' --metrics-jsonl files, or their --output-dir folders (one or more: one plot)")
      ->required();
  sub->add_option("--out", o->out, "the SVG to write")->required();
  sub->add_option("--smoothing", o->smoothing,
                  "weight of the past in the loss's moving average, as TensorBoard's smoothing (0: none)")
      ->check(finite_number())
      ->check(non_negative_number())
      ->check(at_most(0.999, "1 would never move the average"))
      ->capture_default_str();
  add_bool_flag(sub, "--overwrite", o->overwrite, "replace an existing --out");
  return {sub, [o]() {
            // A run's folder (train's --output-dir) stands for its metrics.jsonl, as TensorBoard takes run folders.
            for (std::string& m : o->metrics) {
              std::error_code ec;
              if (!std::filesystem::is_directory(m, ec)) continue;
              const std::string inside = (std::filesystem::path(m) / "metrics.jsonl").string();
              if (!std::filesystem::exists(inside, ec))
                throw Error("plot: " + m + " is a folder without metrics.jsonl: give a run's --output-dir or its "
                            "--metrics-jsonl file");
              m = inside;
            }
            // Never one of the runs' metrics files it reads, overwrite or not (a run's history is not redrawn).
            prepare_output_target("plot: --out", o->out, o->overwrite, o->metrics);
            static const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"};
            std::vector<Run> runs;
            for (size_t i = 0; i < o->metrics.size(); ++i)
              runs.push_back(read_metrics(o->metrics[i], kColors[i % std::size(kColors)]));
            write_file_durably(o->out, render_svg(runs, o->smoothing));
            for (const Run& r : runs)
              fmt::print("plotted {} steps ({} with eval loss) of {} to {}\n", r.loss.points.size(), r.eval.points.size(),
                         r.label, o->out);
            return 0;
          }};
}

}  // namespace qwen3::cli
