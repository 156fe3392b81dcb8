//! cuquota's shared pieces: the region files (limits written by the node agent, usage shared by a container's
//! processes) and configuration parsing. No CUDA and no exported C symbols live here.
