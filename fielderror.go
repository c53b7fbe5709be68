package caddyfairqueue

import (
	"errors"
	"reflect"
	"strings"
)

// optionError is a config error of an option that the Caddyfile and the
// JSON config spell apart: `weight <tenant> <w>` is an entry of
// `weights`, a reject block is `reject[1]`, redis's `address` is
// `redis.addresses`. Error is the Caddyfile's wording, to which the
// Caddyfile parser adds the line; Provision refuses a config with json's,
// which names the field by its path as the JSON writes it, and, for an
// error met at load (atLoad), the Caddyfile's wording too: Provision
// cannot tell a Caddyfile's config from JSON, and a Caddyfile's reaches
// it with an {env.*} placeholder replaced only at load. The other
// errors a Caddyfile meets at adapt, in its own words: a JSON config
// alone reaches Provision with them, and reads them in its words alone.
type optionError struct {
	caddyfile string // the whole message, in the Caddyfile's words
	path      string // the JSON field, relative to its block's (status, [1], fields["x"]); "": the block
	msg       string // what is wrong with it
	atLoad    bool   // met at load only (a placeholder replaced then): json adds the Caddyfile's wording
}

func (e *optionError) Error() string { return e.caddyfile }

// json is the error as Provision words it: the field's path, what is
// wrong with it, then, for an error met at load where the Caddyfile
// words it apart, the Caddyfile's wording: "redis.addresses[0]: is empty
// once its placeholders are replaced (Caddyfile: redis: an address is
// empty once its placeholders are replaced)".
func (e *optionError) json() string {
	s := e.msg
	if e.path != "" {
		s = e.path + ": " + e.msg
	}
	if e.atLoad && e.caddyfile != "" && e.caddyfile != s {
		s += " (Caddyfile: " + e.caddyfile + ")"
	}
	return s
}

// optErr is the error of an option the Caddyfile words as caddyfile and
// JSON as path: msg.
func optErr(caddyfile, path, msg string) error {
	return &optionError{caddyfile: caddyfile, path: path, msg: msg}
}

// atLoad marks err, an option's error (optErr), as one met at load
// only, with a placeholder replaced then: a Caddyfile's config meets it
// in Provision, whose error names the Caddyfile's option too.
func atLoad(err error) error {
	if oe, ok := err.(*optionError); ok {
		c := *oe
		c.atLoad = true
		return &c
	}
	return err
}

// inField puts err's JSON path under field (reject[1], redis): the
// field of a block, or an entry of a list. An error of no option's is
// returned as it is.
func inField(field string, err error) error {
	oe, ok := err.(*optionError)
	if !ok {
		return err
	}
	path := field
	switch {
	case oe.path == "":
	case strings.HasPrefix(oe.path, "["):
		path += oe.path
	default:
		path += "." + oe.path
	}
	return &optionError{caddyfile: oe.caddyfile, path: path, msg: oe.msg, atLoad: oe.atLoad}
}

// jsonError is err as a JSON config reads it: an option's error names
// the JSON field; so does one of the adaptive block's options, which the
// engine words "adaptive: <option> ...". Other errors name an option
// both spell alike (max_wait), and are returned as they are.
func jsonError(err error) error {
	var oe *optionError
	if errors.As(err, &oe) {
		return errors.New(oe.json())
	}
	if err == nil {
		return nil
	}
	if rest, ok := strings.CutPrefix(err.Error(), "adaptive: "); ok {
		field, msg, _ := strings.Cut(rest, " ")
		if _, known := jsonFields(reflect.TypeFor[AdaptiveConfig]())[field]; known && msg != "" {
			return errors.New("adaptive." + field + ": " + msg)
		}
	}
	return err
}
