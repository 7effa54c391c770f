package pybroker.compat;

import java.util.Collection;
import java.util.Map;

/** JSON text of the facts scenarios report: maps, collections, strings, numbers, booleans
 *  and null (anything else as its string). */
final class Json {
    private Json() {
    }

    static String write(Object value) {
        StringBuilder out = new StringBuilder();
        write(value, out);
        return out.toString();
    }

    private static void write(Object value, StringBuilder out) {
        if (value == null) {
            out.append("null");
        } else if (value instanceof Boolean || value instanceof Integer || value instanceof Long
                   || value instanceof Short) {
            out.append(value);
        } else if (value instanceof Number number) {
            double real = number.doubleValue();
            out.append(Double.isFinite(real) ? String.valueOf(real) : "null");
        } else if (value instanceof Map<?, ?> map) {
            out.append('{');
            String separator = "";
            for (Map.Entry<?, ?> entry : map.entrySet()) {
                out.append(separator);
                string(String.valueOf(entry.getKey()), out);
                out.append(": ");
                write(entry.getValue(), out);
                separator = ", ";
            }
            out.append('}');
        } else if (value instanceof Collection<?> items) {
            out.append('[');
            String separator = "";
            for (Object item : items) {
                out.append(separator);
                write(item, out);
                separator = ", ";
            }
            out.append(']');
        } else {
            string(String.valueOf(value), out);
        }
    }

    private static void string(String text, StringBuilder out) {
        out.append('"');
        for (int i = 0; i < text.length(); i++) {
            char c = text.charAt(i);
            switch (c) {
                case '"' -> out.append("\\\"");
                case '\\' -> out.append("\\\\");
                case '\n' -> out.append("\\n");
                case '\r' -> out.append("\\r");
                case '\t' -> out.append("\\t");
                default -> {
                    if (c < 0x20) {
                        out.append(String.format("\\u%04x", (int) c));
                    } else {
                        out.append(c);
                    }
                }
            }
        }
        out.append('"');
    }
}
