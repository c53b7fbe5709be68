package redisstore

import "cmp"

// ACLRules is the ACL a Redis user needs to hold the queues of key
// prefix ("": DefaultKeyPrefix), as the rules of ACL SETUSER: the queues'
// keys and the registry's, the queues' channels, and the commands of
// +@all -@dangerous (the scripts, pub/sub, the reads and writes) but for
// SCRIPT and FUNCTION, which the queue never runs (it runs its scripts
// with EVALSHA and EVAL) and which would let the user flush the
// functions and scripts of every application on the server. A user
// without one of them is answered NOPERM. The prefix stands in the
// patterns as written: its characters special in them (`*`, `?`, `[`,
// `]`, `\`) are quoted, so that the rules grant its queues, and no other
// prefix's.
func ACLRules(prefix string) string {
	p := globEscape(braces.Replace(cmp.Or(prefix, DefaultKeyPrefix)))
	return "resetkeys resetchannels ~{" + p + ":* ~{" + p + "}:* &{" + p + ":* +@all -@dangerous -script -function"
}

// PermissionsNeeded is ACLRules of the store's key prefix
// (fairqueue.PermissionNeeder).
func (s *Store) PermissionsNeeded() string { return ACLRules(s.prefix) }
