"""The bundled model's training recipe (dgchat-tiny-plays): data, tokenizer, training, distillation,
measures and bundling. Research code that users never run; the converter (dgchat.convert) does not
import it."""
