# gnuplot docs/results/long-context-ppl.gp  (run from the repository root)
# Left: caches read from the packed pages only (--no-kv-recent-f16); right: with the
# recent-token f16 window (the default of the kvq commands), its buffers counted.
set terminal pngcairo size 1400,650 font ",10" noenhanced
set output "docs/results/long-context-ppl.png"
set multiplot layout 1,2 title "kvq-tiny-llama, valid.txt (65,520 tokens), ctx 4096: perplexity increase vs the f32 cache (5.5399)"
set xlabel "bits per cached value (K and V, all layers)"
set ylabel "perplexity increase (%)"
set logscale y
set yrange [0.1:60]
set xrange [2:9]
set grid
set key top right
set arrow 1 from 2,1 to 9,1 nohead dt 2 lc rgb "red"
set label 1 "+1% bar" at 8.2,1.15 tc rgb "red"
set arrow 2 from first 4.5, graph 0 to first 4.5, graph 1 nohead dt 3 lc rgb "gray"
set label 2 "q4_0 bytes" at 4.55,40 tc rgb "gray"
set title "packed pages only (--no-kv-recent-f16)"
plot "docs/results/long-context-ppl-uniform.dat" using 1:($2 > 0.1 ? $2 : 0.1):3 with labels offset 0,0.8 font ",8" notitle, \
     "docs/results/long-context-ppl-uniform.dat" using 1:($2 > 0.1 ? $2 : 0.1) with points pt 7 ps 1.2 title "uniform K/V types", \
     "docs/results/long-context-ppl-mixed.dat" using 1:2 with points pt 6 ps 1.2 lc rgb "dark-green" title "per-layer types / +vnc", \
     "docs/results/long-context-ppl-kvauto.dat" using 1:2:3 with labels offset 0,-0.9 font ",8" tc rgb "orange" notitle, \
     "docs/results/long-context-ppl-kvauto.dat" using 1:2 with points pt 9 ps 1.4 lc rgb "orange" title "--kv-auto (nll) at a uniform pair's budget"
set title "with the recent-token f16 window (the default; buffers counted at 4K)"
set xrange [2:6]
set yrange [0.1:20]
set arrow 1 from 2,1 to 6,1 nohead dt 2 lc rgb "red"
set label 1 "+1% bar" at 5.5,1.15 tc rgb "red"
set label 2 "q4_0 bytes" at 4.55,14 tc rgb "gray"
plot "docs/results/long-context-ppl-window.dat" using 1:2:3 with labels offset 0,0.8 font ",8" tc rgb "blue" notitle, \
     "docs/results/long-context-ppl-window.dat" using 1:2 with points pt 5 ps 1.2 lc rgb "blue" title "uniform K/V types + window (sinks: +sinkN)", \
     "docs/results/long-context-ppl-kvauto-window.dat" using 1:2:3 with labels offset 0,-0.9 font ",8" tc rgb "orange" notitle, \
     "docs/results/long-context-ppl-kvauto-window.dat" using 1:2 with points pt 9 ps 1.4 lc rgb "orange" title "--kv-auto (nll) + window at a uniform pair's budget"
unset multiplot
