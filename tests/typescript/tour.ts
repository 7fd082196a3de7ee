// The README's tour through a TypeScript client generated from openapi/openapi.yaml (openapi-typescript
// types, openapi-fetch calls), against a live `oste serve`. Usage: node tour.js BASE_URL ADMIN_TOKEN.
// Prints one JSON line of what it saw; tests/acceptance/test_typescript_client.py checks it.
import createClient from "openapi-fetch";
import type { components, paths } from "./oste.js";

type Problem = components["schemas"]["Problem"];
type Activity = components["schemas"]["Activity"];

const [baseUrl, adminToken] = process.argv.slice(2);
const company = "acme";
const solution = "songs";
const where = { path: { company, solution } };

function must<T>(result: { data?: T; error?: unknown; response: Response }, what: string): T {
  if (result.data === undefined) {
    throw new Error(`${what}: ${result.response.status} ${JSON.stringify(result.error)}`);
  }
  return result.data;
}

const admin = createClient<paths>({ baseUrl, headers: { Authorization: `Bearer ${adminToken}` } });
must(await admin.POST("/v1/companies", { body: { name: company } }), "create the company");
const key = must(
  await admin.POST("/v1/companies/{company}/api-keys", { params: { path: { company } }, body: { name: "partner" } }),
  "create an API key",
);
const client = createClient<paths>({ baseUrl, headers: { Authorization: `Bearer ${key.key}` } });
must(
  await client.POST("/v1/companies/{company}/solutions", { params: { path: { company } }, body: { name: solution } }),
  "create a solution",
);
must(
  await client.POST("/v1/companies/{company}/solutions/{solution}/activity-types", {
    params: where,
    body: { name: "republish", verb: "POST", uri_pattern: "https://receiver.example/songs/{SongId}" },
  }),
  "create an activity type",
);

const activities = "/v1/companies/{company}/solutions/{solution}/activities" as const;
const body = { activity_type: "republish", parameter: { SongId: 7 }, delay: "PT1H" };
const headers = { "Idempotency-Key": "tour-7" };
const first = await client.POST(activities, { params: { ...where, header: headers }, body });
const again = await client.POST(activities, { params: { ...where, header: headers }, body });
const created = must(first, "create an activity") as Activity;
const repeated = must(again, "repeat the create") as Activity;

const refused = await client.POST(activities, {
  params: where,
  body: { activity_type: "republish", parameter: {} },
});
const problem: Problem | undefined = refused.error;

for (const song of [8, 9]) {
  must(
    await client.POST(activities, { params: where, body: { ...body, parameter: { SongId: song } } }),
    "create another activity",
  );
}
const pageOne = must(
  await client.GET(activities, { params: { ...where, query: { limit: 2 } } }),
  "list the first page",
);
const cursor = pageOne.next_cursor ?? undefined;
const pageTwo = must(
  await client.GET(activities, { params: { ...where, query: { limit: 2, cursor } } }),
  "list the next page",
);

console.log(
  JSON.stringify({
    created: { status: first.response.status, id: created.id, state: created.state },
    repeated: { status: again.response.status, id: repeated.id },
    problem: {
      status: refused.response.status,
      type: refused.response.headers.get("content-type"),
      fields: (problem?.errors ?? []).map((e) => e.field),
      detail: problem?.detail,
    },
    pages: [pageOne.items.map((a) => a.id), pageTwo.items.map((a) => a.id)],
    next_cursor: pageTwo.next_cursor,
  }),
);
