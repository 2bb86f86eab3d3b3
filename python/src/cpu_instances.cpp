// The CPU operations compiled once for the extension (the other sources declare them extern:
// DROPIT_CPU_INSTANCES, see setup.py).
#include <dropit/cpu_instances.cpp>
