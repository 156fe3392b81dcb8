/* sim_observer.c: reads the simulated device's timeline (ground truth for GPU-time shares) from outside the
 * programs under test. Runs on the simulator alone (no libcuquota.so), on the same CUDASIM_STATE.
 *
 *   sim_observer DEV PID FROM_NS TO_NS [BIN_NS]
 *
 * Prints busy=<ns>: the device time process PID (as NVML reports it; 0 = every process) occupied device DEV
 * during [FROM_NS, TO_NS) of CLOCK_MONOTONIC, exactly, from the simulator's kernel-interval ring; with BIN_NS
 * also bins=<ns>,<ns>,… for consecutive BIN_NS windows from FROM_NS. Exit 1 when the simulator refuses.
 */
#include <stdio.h>
#include <stdlib.h>

/* Simulator-only export (shim-tests/sim/src/abi/nvml.rs); returns an nvmlReturn_t. */
extern unsigned cudasimDeviceBusyNs(unsigned index, unsigned pid, unsigned long long from_ns,
                                    unsigned long long to_ns, unsigned long long *busy_ns);

static unsigned long long busy(unsigned dev, unsigned pid, unsigned long long from, unsigned long long to) {
    unsigned long long v = 0;
    unsigned r = cudasimDeviceBusyNs(dev, pid, from, to, &v);
    if (r != 0) {
        fprintf(stderr, "sim_observer: cudasimDeviceBusyNs(%u, %u, %llu, %llu) = %u\n", dev, pid, from, to, r);
        exit(1);
    }
    return v;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: sim_observer DEV PID FROM_NS TO_NS [BIN_NS]\n");
        return 2;
    }
    unsigned dev = (unsigned)strtoul(argv[1], NULL, 10), pid = (unsigned)strtoul(argv[2], NULL, 10);
    unsigned long long from = strtoull(argv[3], NULL, 10), to = strtoull(argv[4], NULL, 10);
    printf("busy=%llu\n", busy(dev, pid, from, to));
    if (argc > 5) {
        unsigned long long bin = strtoull(argv[5], NULL, 10);
        if (bin == 0) return 2;
        printf("bins=");
        for (unsigned long long t = from; t < to; t += bin)
            printf("%s%llu", t == from ? "" : ",", busy(dev, pid, t, t + bin < to ? t + bin : to));
        printf("\n");
    }
    return 0;
}
