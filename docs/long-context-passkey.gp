# gnuplot docs/long-context-passkey.gp  (run from the repository root)
set terminal pngcairo size 1000,600 font ",10" noenhanced
set output "docs/long-context-passkey.png"
set title "kvq-tiny-llama passkey retrieval: keys found of 250 (50 trials x 512/1024/2048/3072/4000 tokens, seed 1)"
set xlabel "bits per cached value (K and V, all layers; f16 window buffers counted at 4K)"
set ylabel "keys retrieved (of 250)"
set logscale x 2
set xrange [1.8:40]
set yrange [0:260]
set grid
set key bottom right
plot "docs/long-context-passkey.dat" using 1:2:3 with labels offset 0,0.9 font ",8" notitle, \
     "docs/long-context-passkey.dat" using 1:($4 == 0 ? $2 : 1/0) with points pt 7 ps 1.2 title "uniform / per-layer types", \
     "docs/long-context-passkey.dat" using 1:($4 == 1 ? $2 : 1/0) with points pt 5 ps 1.2 lc rgb "blue" title "--kv-recent-f16"
