package caddyfairqueue

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A config with several bad weights (or reject_stream fields) is
// refused naming the same one each time it is loaded, the first in the
// order of their keys: not one picked by the order Go ranges a map in,
// which would name another entry on each try of `caddy validate`.
func TestSeveralBadEntriesOfAnObjectAreRefusedNamingTheSameOne(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	for _, tc := range []struct{ fields, want string }{
		{`"permits":1,"tenant":"t","weights":{"sha256:0123":2,"sha256:4567":2,"sha256:89ab":2,"sha256:cdef":2}`,
			`weights["sha256:0123"]: a sha256: tenant key must be 16 lowercase hex digits`},
		{`"permits":1,"tenant":"t","weights":{"a":5000,"b":5000,"c":5000,"d":5000}`,
			`weights[<the value of key sha256:ca978112ca1bbdca>]: must be 0.01 to 1000, got 5000`},
		{`"permits":1,"redis":{},"reject_stream":{"key":"k","fields":{"queue":"x","reason":"x","time":"x","wait_ms":"x"}}`,
			`reject_stream.fields["queue"]: is built in`},
	} {
		for range 20 {
			err := loadHandlerJSON(t, tc.fields)
			require.Error(t, err, tc.fields)
			require.Contains(t, err.Error(), tc.want, tc.fields)
		}
	}
}
