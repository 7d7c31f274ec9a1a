"""parabench harness: config -> launcher -> worker (per rank) -> strategy -> probes -> CSV."""
