/**
 * camelCase options → the snake_case request body the daemon validates, by the
 * generated `WIRE_NAMES` (src/generated/options.ts). A controller method hands its
 * options here whole, so a new field of a request model is sent without a line
 * of its own in this SDK: regenerating src/generated/ is enough.
 */

import { type RequestOptions, WIRE_NAMES } from "./generated/options.js";
import type { components } from "./generated/schema.js";

/** A request schema the SDK has camelCase options for (`"SpawnRequest"`, ...). */
export type RequestSchema = keyof RequestOptions;

type Names = Readonly<Record<string, string | readonly [string, RequestSchema]>>;

function isPlainObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** A nested field's value: options (or a list of them, as `volumes`) converted, anything else as it is. */
function nested(schema: RequestSchema, value: unknown): unknown {
  if (Array.isArray(value)) return value.map((item) => (isPlainObject(item) ? convert(schema, item) : item));
  return isPlainObject(value) ? convert(schema, value) : value;
}

function convert(schema: RequestSchema, options: object): Record<string, unknown> {
  const names: Names = WIRE_NAMES[schema];
  const body: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(options)) {
    // Undefined keeps the daemon's default; keys of no field (a method's own options, such as
    // `controller` or `onStdout`) are not the daemon's business. `hasOwn`: never a prototype's key.
    if (value === undefined || !Object.hasOwn(names, key)) continue;
    const name = names[key];
    if (typeof name === "string") body[name] = value;
    else if (name !== undefined) body[name[0]] = nested(name[1], value);
  }
  return body;
}

/**
 * The request body of `schema` for these options: each option under its snake_case
 * name, nested options (`network`) converted too, undefined ones left out. Free-form
 * maps (`env`, `metadata`) are values, sent as they are.
 */
export function toWire<S extends RequestSchema>(schema: S, options: RequestOptions[S]): components["schemas"][S] {
  return convert(schema, options) as components["schemas"][S];
}

/** {@link toWire}, or nothing at all when no option is set (a route whose body is optional). */
export function toWireOrNone<S extends RequestSchema>(
  schema: S,
  options: RequestOptions[S],
): components["schemas"][S] | undefined {
  const body = convert(schema, options);
  return Object.keys(body).length ? (body as components["schemas"][S]) : undefined;
}
