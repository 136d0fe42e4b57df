// `plot METRICS.jsonl --out loss.svg`, read back by an independent XML parser (Python's xml.etree).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "cli_test_util.h"

namespace qwen3 {
namespace {

using test::run_cli;

TEST(PlotCli, SvgHoldsTheLossEvalLossAndLearningRateCurves) {
  test::TempDir dir;
  {
    std::ofstream m(dir.file("metrics.jsonl"));
    for (int step = 1; step <= 20; ++step) {
      m << "{\"step\": " << step << ", \"loss\": " << 5.0 / step << ", \"lr\": " << 1e-4 * step / 20;
      if (step % 5 == 0) m << ", \"eval_loss\": " << 6.0 / step;
      m << "}\n";
    }
  }
  auto r = run_cli("plot " + dir.file("metrics.jsonl") + " --out " + dir.file("loss.svg"));
  ASSERT_EQ(r.code, 0) << r.err;
  // A run's metrics.jsonl is named by its folder (runs/first/metrics.jsonl: "first").
  EXPECT_NE(r.out.find("plotted 20 steps (4 with eval loss) of " + dir.path().filename().string()), std::string::npos)
      << r.out;
  r = run_cli("plot " + dir.file("metrics.jsonl") + " --out " + dir.file("loss.svg"));
  EXPECT_EQ(r.code, 2);  // never replaced unasked
  if (!test::command_succeeds("python3 -c 'import xml.etree.ElementTree'"))
    GTEST_SKIP() << "python3 is not installed: the independent reader did not run";
  // Each curve's point count, whether every point lies inside the picture, and the loss curve's direction
  // (falling loss: SVG y grows downward).
  const std::string script =
      "import sys, xml.etree.ElementTree as ET\n"
      "root = ET.parse(sys.argv[1]).getroot()\n"
      "assert root.tag == '{http://www.w3.org/2000/svg}svg', root.tag\n"
      "w, h = float(root.get('width')), float(root.get('height'))\n"
      "out = {}\n"
      "for p in root.iter('{http://www.w3.org/2000/svg}polyline'):\n"
      "    pts = [tuple(map(float, xy.split(','))) for xy in p.get('points').split()]\n"
      "    assert all(0 <= x <= w and 0 <= y <= h for x, y in pts), p.get('class')\n"
      "    assert all(a[0] < b[0] for a, b in zip(pts, pts[1:])), 'steps must increase'\n"
      "    out[p.get('class')] = (len(pts), pts[0][1] < pts[-1][1])\n"
      "print(out)\n";
  std::ofstream(dir.file("check.py")) << script;
  const test::CliResult py = test::run_shell("python3 " + dir.file("check.py") + " " + dir.file("loss.svg"));
  ASSERT_EQ(py.code, 0) << py.err;
  EXPECT_EQ(py.out, "{'loss_raw': (20, True), 'loss': (20, True), 'eval_loss': (4, True), 'lr': (20, False)}\n");
}

// What a person reads off the picture: ticks at 1, 2 or 5 times a power of ten (at most seven an axis), the
// moving average smoother than the per-step loss it is drawn over, a constant learning rate as a level line in
// the middle of its panel (not on a ±0.5 axis), and several runs in one plot, a color each. (Looked at as PNGs
// through rsvg-convert when written: docs/trainer.md.)
TEST(PlotCli, TicksSmoothingConstantRateAndSeveralRuns) {
  if (!test::command_succeeds("python3 -c 'import xml.etree.ElementTree'"))
    GTEST_SKIP() << "python3 is not installed: the independent reader did not run";
  test::TempDir dir;
  {
    std::ofstream a(dir.file("a.jsonl")), b(dir.file("b.jsonl"));
    for (int step = 1; step <= 300; ++step) {
      const double noise = (step * 7919 % 13) / 13.0 - 0.5;  // deterministic zig-zag
      a << "{\"step\": " << step << ", \"loss\": " << 3.0 / (1 + step / 50.0) + 0.4 * noise << ", \"lr\": 2e-05}\n";
      if (step <= 200) b << "{\"step\": " << step << ", \"loss\": " << 2.5 / (1 + step / 40.0) << ", \"lr\": 3e-05}\n";
    }
  }
  auto r = run_cli("plot " + dir.file("a.jsonl") + " " + dir.file("b.jsonl") + " --out " + dir.file("two.svg"));
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string script =
      "import sys, math, xml.etree.ElementTree as ET\n"
      "ns = '{http://www.w3.org/2000/svg}'\n"
      "root = ET.parse(sys.argv[1]).getroot()\n"
      "def nice(v):\n"
      "    if v == 0: return True\n"
      "    m = abs(v) / 10 ** math.floor(math.log10(abs(v)) + 1e-9)\n"
      "    return any(abs(m - k) < 1e-6 or abs(m - k * 10) < 1e-6 for k in (1, 2, 2.5, 3, 4, 5, 6, 7, 8, 9))\n"
      "for cls in ('xtick', 'ytick'):\n"
      "    texts = [float(t.text) for t in root.iter(ns + 'text') if t.get('class') == cls]\n"
      "    assert texts, cls\n"
      "    steps = sorted(set(round(b - a, 12) for a, b in zip(texts, texts[1:]) if b > a))\n"
      "    for s in steps: assert s > 0 and nice(s) and round(s / 10 ** math.floor(math.log10(s)), 6) in (1, 2, 5), (cls, s)\n"
      "lines = {}\n"
      "for p in root.iter(ns + 'polyline'):\n"
      "    pts = [tuple(map(float, xy.split(','))) for xy in p.get('points').split()]\n"
      "    lines.setdefault(p.get('class'), []).append((p.get('stroke'), pts))\n"
      "assert len(lines['loss']) == 2 and lines['loss'][0][0] != lines['loss'][1][0], 'a color a run'\n"
      "wiggle = lambda pts: sum(abs(pts[i + 1][1] - 2 * pts[i][1] + pts[i - 1][1]) for i in range(1, len(pts) - 1))\n"
      "assert wiggle(lines['loss'][0][1]) < 0.5 * wiggle(lines['loss_raw'][0][1]), 'the average is smoother'\n"
      "for color, pts in lines['lr']:\n"
      "    ys = set(y for x, y in pts)\n"
      "    assert len(ys) == 1, ys\n"
      "y = [float(r.get('y')) for r in root.iter(ns + 'rect') if r.get('height') == '120'][0]\n"
      "for color, pts in lines['lr']: assert y + 10 < pts[0][1] < y + 110, (y, pts[0][1])\n"
      "print('ok', len([t for t in root.iter(ns + 'text') if t.get('class') == 'legend']))\n";
  std::ofstream(dir.file("check.py")) << script;
  const test::CliResult py = test::run_shell("python3 " + dir.file("check.py") + " " + dir.file("two.svg"));
  ASSERT_EQ(py.code, 0) << py.err;
  EXPECT_EQ(py.out, "ok 2\n");
}

TEST(PlotCli, BadMetricsAreNamedByLine) {
  test::TempDir dir;
  std::ofstream(dir.file("m.jsonl")) << "{\"step\": 1, \"loss\": 2}\nnot json\n";
  auto r = run_cli("plot " + dir.file("m.jsonl") + " --out " + dir.file("x.svg"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find(dir.file("m.jsonl") + ":2: not a metrics line"), std::string::npos) << r.err;
  std::ofstream(dir.file("empty.jsonl")) << "\n";
  r = run_cli("plot " + dir.file("empty.jsonl") + " --out " + dir.file("y.svg"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("no step with a finite loss"), std::string::npos) << r.err;
  // An unfinished last line (a run writing it now, or killed while it wrote) is skipped, said so.
  std::ofstream(dir.file("live.jsonl")) << "{\"step\": 1, \"loss\": 2}\n{\"step\": 2, \"lo";
  r = run_cli("plot " + dir.file("live.jsonl") + " --out " + dir.file("z.svg"));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find(dir.file("live.jsonl") + ":2: an unfinished last line"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("plotted 1 steps"), std::string::npos) << r.out;
}

// Steps that start again (a run resumed before resumes cut its records back, or files joined by hand) are drawn
// once, from their newest records, as TensorBoard purges at a restart; the count of what went is said.
TEST(PlotCli, RepeatedStepsAreDrawnOnceFromTheirNewestRecords) {
  test::TempDir dir;
  {
    std::ofstream m(dir.file("metrics.jsonl"));
    for (const int step : {1, 2, 3, 4, 3, 4, 5}) m << "{\"step\": " << step << ", \"loss\": " << 1.0 / step << "}\n";
  }
  const auto r = run_cli("plot " + dir.file("metrics.jsonl") + " --out " + dir.file("loss.svg"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("plotted 5 steps"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("its steps start again 1 time(s)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("the 2 earlier record(s) of the repeated steps are not drawn"), std::string::npos) << r.err;
}

// --out is an output target: an existing file only with --overwrite, a folder never, and never a metrics file the
// command reads, with --overwrite or not (it once replaced a run's metrics with the picture of them).
TEST(PlotCli, OutNeverReplacesWhatItReads) {
  test::TempDir dir;
  const std::string metrics = "{\"step\": 1, \"loss\": 2}\n";
  std::ofstream(dir.file("m.jsonl")) << metrics;
  auto r = run_cli("plot " + dir.file("m.jsonl") + " --out " + dir.file("m.jsonl") + " --overwrite");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("is the input file"), std::string::npos) << r.err;
  EXPECT_EQ(test::slurp(dir.file("m.jsonl")), metrics);
  std::filesystem::create_directories(dir.file("folder"));
  r = run_cli("plot " + dir.file("m.jsonl") + " --out " + dir.file("folder") + " --overwrite");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("is a directory; give a file path"), std::string::npos) << r.err;
  std::ofstream(dir.file("old.svg")) << "old";
  r = run_cli("plot " + dir.file("m.jsonl") + " --out " + dir.file("old.svg"));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(test::slurp(dir.file("old.svg")), "old");
  r = run_cli("plot " + dir.file("m.jsonl") + " --out " + dir.file("old.svg") + " --overwrite");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(test::slurp(dir.file("old.svg")).find("<svg"), std::string::npos);
}

// A run's folder (train's --output-dir) stands for its metrics.jsonl, labelled with the folder's name; a folder
// without one is named, and the metrics inside it are as much an input as a file given by its path.
TEST(PlotCli, ARunFolderStandsForItsMetrics) {
  test::TempDir dir;
  std::filesystem::create_directories(dir.file("run-a"));
  const std::string metrics = "{\"step\": 1, \"loss\": 2}\n{\"step\": 2, \"loss\": 1.5}\n";
  std::ofstream(dir.file("run-a/metrics.jsonl")) << metrics;
  auto r = run_cli("plot " + dir.file("run-a") + " --out " + dir.file("a.svg"));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("plotted 2 steps (0 with eval loss) of run-a to " + dir.file("a.svg")), std::string::npos)
      << r.out;
  std::filesystem::create_directories(dir.file("empty"));
  r = run_cli("plot " + dir.file("empty") + " --out " + dir.file("b.svg"));
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("plot: " + dir.file("empty") + " is a folder without metrics.jsonl"), std::string::npos)
      << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir.file("b.svg")));
  r = run_cli("plot " + dir.file("run-a") + " --out " + dir.file("run-a/metrics.jsonl") + " --overwrite");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(test::slurp(dir.file("run-a/metrics.jsonl")), metrics);
}

}  // namespace
}  // namespace qwen3
