// cnitool, the reference CNI client (ADD/CHECK/DEL/GC/STATUS), built from the published module (.ci/deps.sh).
module tether.test/peers/cni

go 1.24

tool github.com/containernetworking/cni/cnitool

require github.com/containernetworking/cni v1.3.0 // indirect
