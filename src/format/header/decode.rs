//! Reading a header's records straight from its bytes (the decode half of [`super::Header::from_cbor`]).

use super::*;

/// Reserve for `n` announced items no more than `left` input bytes can hold.
fn reserve(n: u64, left: usize, min_bytes: usize) -> usize {
    n.min((left / min_bytes) as u64) as usize
}

/// Reads the header's records straight from the bytes. Depths count the arrays and maps around
/// a value from the root (0), as [`cbor::decode`] counts them, so both accept the same nesting.
pub(super) struct Parser<'a> {
    pub(super) r: Reader<'a>,
}

impl<'a> Parser<'a> {
    fn item(&mut self, at: At<'_>, what: fmt::Arguments<'_>) -> FormatResult<(usize, Item<'a>)> {
        let start = self.r.pos();
        let item = self.r.item().map_err(|e| within(e, at, what))?;
        Ok((start, item))
    }

    fn wrong(
        at: At<'_>,
        what: fmt::Arguments<'_>,
        start: usize,
        found: Item<'_>,
        expected: &str,
    ) -> FormatError {
        invalid4(
            at,
            format_args!(
                "{what} is {}, not {expected} (CBOR byte {start})",
                found.kind()
            ),
        )
    }

    fn array(&mut self, at: At<'_>, what: fmt::Arguments<'_>) -> FormatResult<u64> {
        match self.item(at, what)? {
            (_, Item::Array(n)) => Ok(n),
            (start, other) => Err(Self::wrong(at, what, start, other, "an array")),
        }
    }

    /// A record of at least `min` elements; returns how many later elements follow them.
    fn record(&mut self, at: At<'_>, what: fmt::Arguments<'_>, min: u64) -> FormatResult<u64> {
        let n = self.array(at, what)?;
        n.checked_sub(min).ok_or_else(|| {
            invalid4(
                at,
                format_args!("{what} has {n} elements, fewer than the {min} listed"),
            )
        })
    }

    fn uint(&mut self, at: At<'_>, what: fmt::Arguments<'_>) -> FormatResult<u64> {
        match self.item(at, what)? {
            (_, Item::Uint(n)) => Ok(n),
            (start, other) => Err(Self::wrong(at, what, start, other, "an unsigned integer")),
        }
    }

    fn text(&mut self, at: At<'_>, what: fmt::Arguments<'_>) -> FormatResult<&'a str> {
        match self.item(at, what)? {
            (_, Item::Text(text)) => Ok(text),
            (start, other) => Err(Self::wrong(at, what, start, other, "a text string")),
        }
    }

    /// Skips `n` later elements at `depth`, still in the extension value domain.
    fn skip(
        &mut self,
        n: u64,
        depth: usize,
        at: At<'_>,
        what: fmt::Arguments<'_>,
    ) -> FormatResult<()> {
        for _ in 0..n {
            self.r
                .skip(Domain::Extension, depth)
                .map_err(|e| within(e, at, format_args!("a later field of {what}")))?;
        }
        Ok(())
    }

    /// A text-keyed map at `depth` with values in `domain`.
    fn map(
        &mut self,
        domain: Domain,
        depth: usize,
        at: At<'_>,
        what: fmt::Arguments<'_>,
    ) -> FormatResult<Config> {
        let entries = self
            .r
            .map(domain, depth, &|| format!("{at}: {what}"))
            .map_err(|e| within(e, at, what))?;
        Ok(entries.into_iter().collect())
    }

    fn object(
        &mut self,
        depth: usize,
        at: At<'_>,
        what: fmt::Arguments<'_>,
    ) -> FormatResult<ObjectRef> {
        let later = self.record(at, what, 2)?;
        let sha256 = match self.item(at, what)? {
            (_, Item::Bytes(bytes)) => match <[u8; 32]>::try_from(bytes) {
                Ok(digest) => Sha256(digest),
                Err(_) => {
                    return Err(invalid4(
                        at,
                        format_args!("{what}'s sha256 is {} bytes, not 32", bytes.len()),
                    ))
                }
            },
            (start, other) => return Err(Self::wrong(at, what, start, other, "a byte string")),
        };
        let length = self.uint(at, format_args!("{what}'s length"))?;
        self.skip(later, depth + 1, at, what)?;
        Ok(ObjectRef { sha256, length })
    }

    fn class(&mut self, at: At<'_>, what: fmt::Arguments<'_>) -> FormatResult<ClassRef> {
        let n = self.array(at, what)?;
        if n != 3 {
            return Err(invalid4(
                at,
                format_args!(
                    "{what} has {n} elements, not exactly three texts [library, version, name]"
                ),
            ));
        }
        Ok(ClassRef {
            library: self.text(at, format_args!("{what}'s library"))?.to_owned(),
            version: self.text(at, format_args!("{what}'s version"))?.to_owned(),
            name: self.text(at, format_args!("{what}'s name"))?.to_owned(),
        })
    }

    fn dtype(&mut self, at: At<'_>) -> FormatResult<Dtype> {
        let name = self.text(at, format_args!("the dtype"))?;
        Dtype::parse(name).map_err(|e| invalid5(at, format_args!("{e}")))
    }

    fn shape(&mut self, at: At<'_>) -> FormatResult<Vec<u64>> {
        let n = self.array(at, format_args!("the shape"))?;
        let mut shape = Vec::with_capacity(n as usize);
        for i in 0..n {
            shape.push(self.uint(at, format_args!("shape extent {i}"))?);
        }
        Ok(shape)
    }

    fn location(&mut self, depth: usize, at: At<'_>) -> FormatResult<Location> {
        let what = format_args!("the location");
        let later = self.record(at, what, 3)?;
        let location = Location {
            chunk: self.uint(at, format_args!("the location's chunk index"))?,
            offset: self.uint(at, format_args!("the location's offset"))?,
            length: self.uint(at, format_args!("the location's length"))?,
        };
        self.skip(later, depth + 1, at, what)?;
        Ok(location)
    }

    pub(super) fn header(mut self) -> FormatResult<Header> {
        let root = At::default();
        let fields = self.array(root, format_args!("the root"))?;
        if fields == 0 {
            return Err(invalid4(
                root,
                format_args!("the root is empty: it has no format tag"),
            ));
        }
        let format = self.text(root, format_args!("the format tag"))?;
        check_format(format)?;
        if fields == ROOT_FIELDS - 1 {
            return Err(invalid4(
                root,
                format_args!("the root has 5 elements: a pre-cut layout, refused as such"),
            ));
        }
        if fields < ROOT_FIELDS {
            return Err(invalid4(
                root,
                format_args!("the root has {fields} elements, fewer than the {ROOT_FIELDS} listed"),
            ));
        }

        let n = self.array(root, format_args!("chunks"))?;
        let mut chunks = Vec::with_capacity(reserve(n, self.r.left(), MIN_OBJECT_BYTES));
        for i in 0..n {
            chunks.push(self.object(2, root, format_args!("chunk {i}"))?);
        }

        let n = self.array(root, format_args!("encodings"))?;
        let mut encodings = Vec::with_capacity(reserve(n, self.r.left(), 3));
        for i in 1..=n {
            let what = format_args!("encoding {i}");
            let later = self.record(root, what, 2)?;
            let scheme = self
                .text(root, format_args!("encoding {i}'s scheme"))?
                .to_owned();
            let params = self.map(
                Domain::Document,
                3,
                root,
                format_args!("encoding {i}'s params"),
            )?;
            self.skip(later, 3, root, what)?;
            encodings.push(Encoding { scheme, params });
        }

        let pipeline = match self.array(root, format_args!("the pipeline"))? {
            0 => None,
            1 => {
                return Err(invalid4(
                    root,
                    format_args!("the pipeline has 1 element: it is [] or [class, config]"),
                ))
            }
            n => {
                let class = self.class(root, format_args!("the pipeline's class"))?;
                let config = self.map(
                    Domain::Config,
                    2,
                    root,
                    format_args!("the pipeline's config"),
                )?;
                self.skip(n - 2, 2, root, format_args!("the pipeline"))?;
                Some(Pipeline { class, config })
            }
        };

        let n = self.array(root, format_args!("components"))?;
        let mut components = Vec::with_capacity(reserve(n, self.r.left(), MIN_COMPONENT_BYTES));
        for i in 0..n {
            components.push(self.component(i)?);
        }

        let metadata = self.map(Domain::Document, 1, root, format_args!("the metadata"))?;
        self.skip(fields - ROOT_FIELDS, 1, root, format_args!("the root"))?;
        self.r.finish()?;
        Ok(Header {
            format: format.to_owned(),
            chunks,
            encodings,
            pipeline,
            components,
            metadata,
        })
    }

    fn component(&mut self, index: u64) -> FormatResult<Component> {
        let root = At::default();
        let what = format_args!("component {index}");
        let later = self.record(root, what, 5)?;
        let name = self.text(root, format_args!("component {index}'s name"))?;
        let at = At::component(name);
        let class = self.class(at, format_args!("the class"))?;
        let config = self.map(Domain::Config, 3, at, format_args!("the config"))?;
        let n = self.array(at, format_args!("the tensors"))?;
        let mut tensors = Vec::with_capacity(reserve(n, self.r.left(), MIN_TENSOR_BYTES));
        for i in 0..n {
            tensors.push(self.tensor(at, i)?);
        }
        let assets = match self.item(at, format_args!("the assets"))? {
            (_, Item::Map(n)) => {
                let mut assets = BTreeMap::new();
                let mut previous = None;
                for _ in 0..n {
                    let (path, encoded) = self
                        .r
                        .key(previous)
                        .map_err(|e| within(e, at, format_args!("the assets")))?;
                    previous = Some(encoded);
                    let object = self.object(4, at, format_args!("asset {path:?}"))?;
                    assets.insert(path.to_owned(), object);
                }
                assets
            }
            (start, other) => {
                return Err(Self::wrong(
                    at,
                    format_args!("the assets"),
                    start,
                    other,
                    "a map",
                ))
            }
        };
        let config_file = match later {
            0 => None,
            _ => {
                let file = self.text(at, format_args!("config_file"))?;
                // Later fields make the default explicit; without them it is never written.
                (later == 1 || file != DEFAULT_CONFIG).then(|| file.to_owned())
            }
        };
        self.skip(
            later.saturating_sub(1),
            3,
            at,
            format_args!("the component"),
        )?;
        Ok(Component {
            name: name.to_owned(),
            class,
            config,
            tensors,
            assets,
            config_file,
        })
    }

    /// A tensor record (at depth 4).
    fn tensor(&mut self, component: At<'_>, index: u64) -> FormatResult<Tensor> {
        let what = format_args!("tensor {index}");
        let later = self.record(component, what, 5)?;
        let key = self.text(component, format_args!("tensor {index}'s key"))?;
        let at = At {
            tensor: Some(key),
            ..component
        };
        let dtype = self.dtype(at)?;
        let shape = self.shape(at)?;
        let body = match self.uint(at, format_args!("the encoding index"))? {
            0 => Body::Plain(self.location(5, at)?),
            number => {
                // An index past the table is refused by validation, with the table's size.
                let encoding = usize::try_from(number - 1).unwrap_or(usize::MAX);
                let n = self.array(at, format_args!("the parts"))?;
                let mut parts = Vec::with_capacity(reserve(n, self.r.left(), MIN_PART_BYTES));
                for i in 0..n {
                    let what = format_args!("part {i}");
                    let later = self.record(at, what, 4)?;
                    let role = self.text(at, format_args!("part {i}'s role"))?;
                    let at = At {
                        part: Some(role),
                        ..at
                    };
                    let dtype = self.dtype(at)?;
                    let shape = self.shape(at)?;
                    let location = self.location(7, at)?;
                    self.skip(later, 7, at, format_args!("the part"))?;
                    parts.push(Part {
                        role: role.to_owned(),
                        dtype,
                        shape,
                        location,
                    });
                }
                Body::Encoded { encoding, parts }
            }
        };
        self.skip(later, 5, at, format_args!("the tensor"))?;
        Ok(Tensor {
            key: key.to_owned(),
            dtype,
            shape,
            body,
        })
    }
}
