#!/usr/bin/env bash
# eval_svg.sh ROOT FORMAT...: the eval loss of ROOT/FORMAT/metrics.jsonl of every format over steps,
# one line each, as SVG on stdout (megatrain plot draws one run; this puts the formats side by side).
set -euo pipefail
ROOT=$1; shift
for f in "$@"; do
    grep '"eval_loss"' "$ROOT/$f/metrics.jsonl" 2>/dev/null | awk -v f="$f" '{
        s = $0; sub(/.*"step": /, "", s); sub(/[^0-9].*/, "", s)
        e = $0; sub(/.*"eval_loss": /, "", e); sub(/[^-0-9.e+].*/, "", e); print f, s, e }' || true
done | awk '
BEGIN { W = 720; H = 420; L = 70; R = 130; T = 30; B = 50
        col["full"] = "#1f77b4"; col["compact"] = "#ff7f0e"; col["tight"] = "#2ca02c" }
{ if (!($1 in seen)) { seen[$1] = 1; fm[nf++] = $1 }
  n = cnt[$1]++; X[$1, n] = $2 + 0; Y[$1, n] = $3 + 0
  if (!init || $2 + 0 > xmax) xmax = $2 + 0
  if (!init || $3 + 0 < ymin) ymin = $3 + 0
  if (!init || $3 + 0 > ymax) ymax = $3 + 0
  init = 1 }
function px(x) { return L + (W - L - R) * x / (xmax ? xmax : 1) }
function py(y) { return T + (H - T - B) * (ymax - y) / (ymax > ymin ? ymax - ymin : 1) }
END {
  printf "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" font-size=\"12\">\n", W, H
  printf "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
  printf "<text x=\"%d\" y=\"18\" font-size=\"14\">eval loss by optimizer state format</text>\n", L
  if (!init) { print "<text x=\"70\" y=\"60\">no eval points yet</text></svg>"; exit }
  printf "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#888\"/>\n", L, T, W - L - R, H - T - B
  for (i = 0; i <= 4; i++) {
    y = ymin + (ymax - ymin) * i / 4; x = xmax * i / 4
    printf "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%.3f</text>\n", L - 5, py(y) + 4, y
    printf "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%d</text>\n", px(x), H - B + 16, x
  }
  printf "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">step</text>\n", (L + W - R) / 2, H - 12
  for (k = 0; k < nf; k++) {
    f = fm[k]; c = (f in col) ? col[f] : "#000"; pts = ""
    for (i = 0; i < cnt[f]; i++) pts = pts sprintf("%.1f,%.1f ", px(X[f, i]), py(Y[f, i]))
    printf "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"%s\"/>\n", c, pts
    last = cnt[f] - 1
    printf "<text x=\"%d\" y=\"%d\" fill=\"%s\">%s %.4f</text>\n", W - R + 8, T + 16 + 16 * k, c, f, Y[f, last]
  }
  print "</svg>"
}'
