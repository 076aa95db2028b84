// MPI's own MPI_Allreduce / MPI_Reduce_scatter_block / MPI_Allgather / MPI_Bcast on f32,
// timed as `zerodp bench-comm` times its collectives (the slowest rank's mean over enough
// iterations for ~0.25 s), printing the same JSON rows. The peer for docs/performance.md.
//   mpirun -np 2 bench_mpi_native [min_bytes] [max_bytes] [factor]
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <fmt/core.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  const long long min_bytes = argc > 1 ? std::atoll(argv[1]) : 1024;
  const long long max_bytes = argc > 2 ? std::atoll(argv[2]) : 256ll << 20;
  const int factor = argc > 3 ? std::atoi(argv[3]) : 4;
  const char* ops[] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast"};
  for (const char* op : ops) {
    for (long long bytes = min_bytes; bytes <= max_bytes; bytes *= factor) {
      const int count = static_cast<int>(bytes / 4);
      const int chunk = count / n;
      std::vector<float> in(static_cast<size_t>(count), 1.0f), out(static_cast<size_t>(count));
      const std::string name = op;
      auto call = [&] {
        if (name == "all_reduce") {
          MPI_Allreduce(MPI_IN_PLACE, in.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        } else if (name == "reduce_scatter") {
          MPI_Reduce_scatter_block(in.data(), out.data(), chunk, MPI_FLOAT, MPI_SUM,
                                   MPI_COMM_WORLD);
        } else if (name == "all_gather") {
          MPI_Allgather(in.data(), chunk, MPI_FLOAT, out.data(), chunk, MPI_FLOAT, MPI_COMM_WORLD);
        } else {
          MPI_Bcast(in.data(), count, MPI_FLOAT, 0, MPI_COMM_WORLD);
        }
      };
      call();
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      call();
      double one = MPI_Wtime() - t0, slowest = 0;
      MPI_Allreduce(&one, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      const int iters = std::clamp(static_cast<int>(0.25 / std::max(slowest, 1e-7)), 1, 1000);
      MPI_Barrier(MPI_COMM_WORLD);
      t0 = MPI_Wtime();
      for (int i = 0; i < iters; ++i) call();
      double elapsed = MPI_Wtime() - t0, worst = 0;
      MPI_Allreduce(&elapsed, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      const double t = worst / iters;
      const double algbw = static_cast<double>(bytes) / t / 1e9;
      const double f = name == "all_reduce"  ? 2.0 * (n - 1) / n
                       : name == "broadcast" ? 1.0
                                             : static_cast<double>(n - 1) / n;
      if (rank == 0) {
        fmt::print(
            "{{\"op\":\"{}\",\"dtype\":\"f32\",\"bytes\":{},\"time_us\":{:.3f},\"algbw\":{:.4f},"
            "\"busbw\":{:.4f},\"wrong\":null,\"ranks\":{},\"backend\":\"openmpi-native\","
            "\"iters\":{}}}\n",
            name, bytes, t * 1e6, algbw, algbw * f, n, iters);
        std::fflush(stdout);
      }
    }
  }
  MPI_Finalize();
  return 0;
}
