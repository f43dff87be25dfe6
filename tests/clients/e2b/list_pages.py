"""An E2B user's paged sandbox list, unchanged: Sandbox.list with a small page size, read with the
SDK's paginator until it has no next page. Prints the ids seen, in order, as JSON."""

import json
import sys

from e2b import Sandbox

limit = int(sys.argv[1])
paginator = Sandbox.list(limit=limit)
seen = []
pages = 0
while paginator.has_next:
    items = paginator.next_items()
    assert len(items) <= limit, (len(items), limit)
    seen += [item.sandbox_id for item in items]
    pages += 1
print(json.dumps({"ids": seen, "pages": pages}))
