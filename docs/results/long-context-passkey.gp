# gnuplot docs/results/long-context-passkey.gp  (run from the repository root)
# Left: everything up to q8_0 (f16 and f32 also find 250 of 250); right: the 3-5 bit range.
set terminal pngcairo size 1200,600 font ",10" noenhanced
set output "docs/results/long-context-passkey.png"
set multiplot layout 1,2 title "kvq-tiny-llama passkey retrieval: keys found of 250 (50 trials x 512/1024/2048/3072/4000 tokens, seed 1; f16/f16 and f32/f32: 250)"
set xlabel "bits per cached value (K and V, all layers; f16 window buffers counted at 4K)"
set ylabel "keys retrieved (of 250)"
set grid
set key bottom right
set arrow 1 from 2,250 to 9,250 nohead dt 2 lc rgb "red"
set xrange [2:9]
set yrange [95:258]
P = "docs/results/long-context-passkey.dat"
plot P using 1:($4 == 0 ? $2 : 1/0):3 with labels offset 0,0.9 font ",8" notitle, \
     P using 1:($4 == 0 ? $2 : 1/0) with points pt 7 ps 1.2 title "uniform K/V types (--no-kv-recent-f16)", \
     P using 1:($4 == 1 ? $2 : 1/0) with points pt 5 ps 1.2 lc rgb "blue" title "with the recent-token f16 window (the default)", \
     P using 1:($4 == 2 ? $2 : 1/0) with points pt 9 ps 1.4 lc rgb "orange" title "--kv-auto (nll) at q4_0's budget"
set title "3 to 5 bits per value"
set arrow 1 from 3,250 to 5,250 nohead dt 2 lc rgb "red"
set xrange [3:5]
set yrange [228:253]
set key off
# labels sit $5 keys above (below) their point, so that neighbours do not overlap
plot P using 1:($4 == 0 ? $2 + $5 * 0.8 : 1/0):3 with labels font ",8" notitle, \
     P using 1:($4 == 0 ? $2 : 1/0) with points pt 7 ps 1.2, \
     P using 1:($4 == 1 ? $2 + $5 * 0.8 : 1/0):3 with labels font ",8" tc rgb "blue" notitle, \
     P using 1:($4 == 1 ? $2 : 1/0) with points pt 5 ps 1.2 lc rgb "blue", \
     P using 1:($4 == 2 ? $2 + $5 * 0.8 : 1/0):3 with labels font ",8" tc rgb "orange" notitle, \
     P using 1:($4 == 2 ? $2 : 1/0) with points pt 9 ps 1.4 lc rgb "orange"
unset multiplot
