package patroni

import (
	"net"
	"strconv"
	"testing"
)

// TestFreePortsAreBelowTheEphemeralRange: the ports picked for the
// cluster's servers lie below the kernel's ephemeral range, where no
// outgoing connection can take one before its server binds it; they are
// distinct and free.
func TestFreePortsAreBelowTheEphemeralRange(t *testing.T) {
	low := ephemeralLow()
	if low <= minPort+1000 {
		t.Fatalf("ephemeral range starts at %d: this machine leaves no room below it", low)
	}
	ports, err := freePorts(20)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if p < minPort || p >= low || seen[p] {
			t.Errorf("port %d: want distinct ports in [%d, %d)", p, minPort, low)
		}
		seen[p] = true
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			t.Errorf("port %d is not free: %v", p, err)
			continue
		}
		l.Close()
	}
}
