package caddyfairqueue

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
)

// The ACL docs/reference.md gives (`ACL SETUSER fq on >secret ...`) is
// the one the queue prints (the log's needs, store_refused, status
// --redis: redisstore.ACLRules), command for command; and the shortened
// ones of failures.md and operations.md (`... ~{fair_queue:* ...`) start
// as it does. A command added to the code and not to the page, or taken
// from the page alone, would leave a user granted the page's ACL
// refused on a path the page's own test does not take (a Cluster's
// reshard, a tool).
func TestTheDocumentedACLIsTheOneTheQueuePrints(t *testing.T) {
	doc, err := os.ReadFile("docs/reference.md")
	require.NoError(t, err)
	m := regexp.MustCompile("`ACL SETUSER fq on >secret ([^`]+)`").FindSubmatch(doc)
	require.NotNil(t, m, "docs/reference.md gives the ACL")
	assert.Equal(t, redisstore.ACLRules(""), string(m[1]), "docs/reference.md")
	for _, page := range []string{"docs/failures.md", "docs/operations.md"} {
		b, err := os.ReadFile(page)
		require.NoError(t, err)
		// A snippet may be wrapped over lines within its backticks.
		text := strings.Join(strings.Fields(string(b)), " ")
		found := regexp.MustCompile("`(?:\\.\\.\\.; the user needs: )?ACL SETUSER <user> ([^`]+?) ?\\.\\.\\.`").FindAllStringSubmatch(text, -1)
		require.NotEmpty(t, found, "%s gives the ACL", page)
		for _, f := range found {
			assert.True(t, strings.HasPrefix(redisstore.ACLRules(""), f[1]), "%s: %q is not how %q starts", page, f[1], redisstore.ACLRules(""))
		}
	}
}
