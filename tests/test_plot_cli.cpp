// `plot METRICS.jsonl --out loss.svg`, read back by an independent XML parser (Python's xml.etree).
#include <gtest/gtest.h>

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
  EXPECT_NE(r.out.find("plotted 20 steps (4 with eval loss)"), std::string::npos) << r.out;
  r = run_cli("plot " + dir.file("metrics.jsonl") + " --out " + dir.file("loss.svg"));
  EXPECT_EQ(r.code, 2);  // never replaced unasked
  if (std::system("python3 -c 'import xml.etree.ElementTree' > /dev/null 2>&1") != 0)
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
  EXPECT_EQ(py.out, "{'loss': (20, True), 'eval_loss': (4, True), 'lr': (20, False)}\n");
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
}

}  // namespace
}  // namespace qwen3
