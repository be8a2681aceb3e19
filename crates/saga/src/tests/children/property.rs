//! A property test of random nested shapes (depth ≤ 3, every step undoable): what the
//! agents did and undid, in order, across a whole tree of sagas, against a model of
//! the expected ledger, with one failing agent step anywhere in the tree (or none).

use super::*;

/// The deepest a tree goes (the root is 1): within the engine's default bound.
const DEPTH: usize = 3;

/// Trees run together in one world (each with its own definitions).
const TREES: usize = 15;

/// One saga of a tree: its steps, in order (one stage each).
#[derive(Debug)]
struct Node {
    name: String,
    steps: Vec<Kind>,
}

#[derive(Debug)]
enum Kind {
    /// An agent step `s<i>` at `a<i>`, undone by a compensation at `a<i>`.
    Agent,
    /// A step that runs this saga as its child.
    Child(Node),
}

/// A random saga at `depth`: the root 1–4 steps, a child 1–3; each an agent step or,
/// above the deepest level, a child saga. Names are `t<tree>_<n>`, distinct.
fn random_node(rng: &mut fastrand::Rng, tree: usize, depth: usize, next: &mut usize) -> Node {
    let name = format!("t{tree}_{next}");
    *next += 1;
    let n = if depth == 1 {
        rng.usize(1..=4)
    } else {
        rng.usize(1..=3)
    };
    let steps = (0..n)
        .map(|_| {
            if depth < DEPTH && rng.bool() {
                Kind::Child(random_node(rng, tree, depth + 1, next))
            } else {
                Kind::Agent
            }
        })
        .collect();
    Node { name, steps }
}

/// The definitions of `node` and of its children, to `out`.
fn definitions(node: &Node, out: &mut Vec<SagaDefinition>) {
    let mut b = Saga::<D>::builder(node.name.clone(), 1);
    for (i, kind) in node.steps.iter().enumerate() {
        let step = match kind {
            Kind::Agent => Step::<D>::new(format!("s{i}"), format!("a{i}"))
                .compensate(format!("a{i}"), move |_: &D| json!({ "undo": i })),
            Kind::Child(child) => {
                definitions(child, out);
                Step::<D>::saga(format!("s{i}"), child.name.clone())
            }
        };
        b = b.step(step.retry(fast()));
    }
    out.push(b.build().unwrap());
}

/// Where each saga of a tree sits: its path ("r", "r.1", "r.1.0": the steps that lead
/// to it) and its parent, for every saga the tree may start.
fn places(
    node: &Node,
    id: SagaId,
    path: String,
    parent: Option<SagaId>,
    out: &mut HashMap<SagaId, (String, Option<SagaId>)>,
) {
    for (i, kind) in node.steps.iter().enumerate() {
        if let Kind::Child(child) = kind {
            places(child, child_id(id, i), format!("{path}.{i}"), Some(id), out);
        }
    }
    out.insert(id, (path, parent));
}

/// The sagas of a tree.
fn count(node: &Node) -> usize {
    1 + node
        .steps
        .iter()
        .map(|k| match k {
            Kind::Child(child) => count(child),
            Kind::Agent => 0,
        })
        .sum::<usize>()
}

/// The agent steps of a tree, with their depth: where a failure may be.
fn agent_steps(node: &Node, id: SagaId, depth: usize, out: &mut Vec<(SagaId, usize, usize)>) {
    for (i, kind) in node.steps.iter().enumerate() {
        match kind {
            Kind::Agent => out.push((id, i, depth)),
            Kind::Child(child) => agent_steps(child, child_id(id, i), depth + 1, out),
        }
    }
}

/// What the engine should do with a tree, given its failing agent step (if any).
#[derive(Debug, Default)]
struct Model {
    done: Vec<(SagaId, usize)>,
    undone: Vec<(SagaId, usize)>,
    /// Each started saga's end; a saga not in it is never started.
    states: HashMap<SagaId, SagaState>,
    /// Completed children later undone as a whole.
    undone_whole: usize,
}

impl Model {
    /// Runs `node` as saga `id`: its steps in order, a child's steps before its
    /// parent's next. `true` if it completed. On a failure the saga compensates what
    /// it did, latest first, the failed step included (its outcome is unknown to the
    /// engine: its compensation goes out too); its parent's step then fails in turn.
    fn run(&mut self, node: &Node, id: SagaId, fail: Option<(SagaId, usize)>) -> bool {
        let mut completed = Vec::new();
        for (i, kind) in node.steps.iter().enumerate() {
            let ok = match kind {
                Kind::Agent if fail == Some((id, i)) => {
                    self.undone.push((id, i));
                    false
                }
                Kind::Agent => {
                    self.done.push((id, i));
                    true
                }
                // A failed child compensated itself: its step's undo, which goes out
                // too, finds nothing left to do (no agent undoes anything).
                Kind::Child(child) => self.run(child, child_id(id, i), fail),
            };
            if !ok {
                for &j in completed.iter().rev() {
                    self.undo(node, id, j);
                }
                self.states.insert(id, SagaState::Compensated);
                return false;
            }
            completed.push(i);
        }
        self.states.insert(id, SagaState::Completed);
        true
    }

    /// Undoes step `i` of `node` (saga `id`), which succeeded: an agent's compensation,
    /// or its completed child undone as a whole (its steps latest first, recursively).
    fn undo(&mut self, node: &Node, id: SagaId, i: usize) {
        match &node.steps[i] {
            Kind::Agent => self.undone.push((id, i)),
            Kind::Child(child) => {
                let cid = child_id(id, i);
                for j in (0..child.steps.len()).rev() {
                    self.undo(child, cid, j);
                }
                self.states.insert(cid, SagaState::Compensated);
                self.undone_whole += 1;
            }
        }
    }
}

/// What a test's cases covered, to check that the random shapes reach what matters.
#[derive(Debug, Default)]
struct Coverage {
    completed: usize,
    compensated: usize,
    deepest_failures: usize,
    undone_whole: usize,
    children: usize,
}

/// One tree and what the model says of it.
struct Tree {
    root: SagaId,
    node: Node,
    fail: Option<(SagaId, usize)>,
    places: HashMap<SagaId, (String, Option<SagaId>)>,
    model: Model,
}

/// `ledger`'s entries of `tree`, as (path, step).
fn in_tree(ledger: &[(SagaId, usize)], tree: &Tree) -> Vec<(String, usize)> {
    ledger
        .iter()
        .filter_map(|(s, i)| tree.places.get(s).map(|(p, _)| (p.clone(), *i)))
        .collect()
}

/// `TREES` random trees in one world, with `duplicate_rate`, checked against the model.
async fn random_trees(backend: Backend, seed: u64, duplicate_rate: f64, cov: &mut Coverage) {
    let mut rng = fastrand::Rng::with_seed(seed * 104_729 + 7);
    let nodes: Vec<Node> = (0..TREES)
        .map(|t| random_node(&mut rng, t, 1, &mut 0))
        .collect();
    let mut defs = Vec::new();
    for node in &nodes {
        definitions(node, &mut defs);
    }
    let mut w = World::new(backend, defs, seed).await;
    w.duplicate_rate = duplicate_rate;
    let mut trees = Vec::new();
    for node in nodes {
        let root = w.start(&node.name, json!({})).await;
        let mut at = HashMap::new();
        places(&node, root, "r".into(), None, &mut at);
        assert_eq!(at.len(), count(&node), "two sagas of one tree share an id");
        let mut leaves = Vec::new();
        agent_steps(&node, root, 1, &mut leaves);
        let fail = if rng.u8(0..4) == 0 {
            None
        } else {
            let (s, i, depth) = leaves[rng.usize(0..leaves.len())];
            if depth == DEPTH {
                cov.deepest_failures += 1;
            }
            Some((s, i))
        };
        let mut model = Model::default();
        model.run(&node, root, fail);
        trees.push(Tree {
            root,
            node,
            fail,
            places: at,
            model,
        });
    }
    let fails: HashSet<(SagaId, usize)> = trees.iter().filter_map(|t| t.fail).collect();
    let roots: Vec<SagaId> = trees.iter().map(|t| t.root).collect();
    let pumped = tokio::time::timeout(
        Duration::from_secs(20),
        w.pump(
            &roots,
            |_, env, step| {
                let saga: SagaId = env.header(header::SAGA_ID).unwrap().parse().unwrap();
                Some(if fails.contains(&(saga, step)) {
                    StepOutcome::Fatal("no".into())
                } else {
                    ok()
                })
            },
            |_, _| ok(),
        ),
    )
    .await;
    if pumped.is_err() {
        let mut unfinished = Vec::new();
        for tree in &trees {
            let mut states = Vec::new();
            for (id, (path, _)) in &tree.places {
                let got = query::get(&w.store, *id).await.unwrap().map(|s| s.state);
                states.push((path.clone(), got, tree.model.states.get(id).copied()));
            }
            if states
                .iter()
                .any(|(_, got, _)| got.is_some_and(|s| !s.is_terminal()))
            {
                states.sort();
                unfinished.push(format!("{}: {states:?}", tree.node.name));
            }
        }
        panic!("seed {seed}: trees unfinished (path, state, expected): {unfinished:#?}");
    }

    for tree in &trees {
        let what = format!(
            "seed {seed}, tree {} failing at {:?}: {:#?}",
            tree.node.name,
            tree.fail.map(|(s, i)| (&tree.places[&s].0, i)),
            tree.node
        );
        let done = in_tree(&w.ledger.done, tree);
        let undone = in_tree(&w.ledger.undone, tree);
        // Each step's effect at most once, each undo at most once and only of a step
        // that was done (or the failed one, whose outcome is unknown).
        let once: HashSet<_> = done.iter().collect();
        assert_eq!(
            once.len(),
            done.len(),
            "a step done twice: {done:?}; {what}"
        );
        let once: HashSet<_> = undone.iter().collect();
        assert_eq!(
            once.len(),
            undone.len(),
            "a step undone twice: {undone:?}; {what}"
        );
        let failed = tree.fail.map(|(s, i)| (tree.places[&s].0.clone(), i));
        for u in &undone {
            assert!(
                done.contains(u) || failed.as_ref() == Some(u),
                "{u:?} undone, never done; {what}"
            );
        }
        assert_eq!(done, in_tree(&tree.model.done, tree), "done; {what}");
        assert_eq!(undone, in_tree(&tree.model.undone, tree), "undone; {what}");
        for (id, (path, parent)) in &tree.places {
            let got = query::get(&w.store, *id).await.unwrap();
            let expected = tree.model.states.get(id).copied();
            assert_eq!(
                got.as_ref().map(|s| s.state),
                expected,
                "saga {path} ended {:?}; {what}",
                got.as_ref().map(|s| &s.error)
            );
            if let Some(got) = got {
                assert_eq!(got.parent_id, *parent, "saga {path}'s parent; {what}");
                if parent.is_some() {
                    cov.children += 1;
                }
            }
        }
        match tree.model.states[&tree.root] {
            SagaState::Completed => cov.completed += 1,
            _ => cov.compensated += 1,
        }
        cov.undone_whole += tree.model.undone_whole;
    }
    let stats = w.store.admin().stats().await.unwrap();
    assert_eq!(stats.in_flight, 0, "seed {seed}");
}

/// Two worlds of `TREES` trees each; the shapes must reach failures at the deepest
/// level, completed children undone as a whole, and both of a root's ends.
async fn nested_shapes(backend: Backend, seeds: [u64; 2], duplicate_rate: f64) {
    let mut cov = Coverage::default();
    for seed in seeds {
        random_trees(backend, seed, duplicate_rate, &mut cov).await;
    }
    assert!(
        cov.completed > 0
            && cov.compensated > 0
            && cov.deepest_failures > 0
            && cov.undone_whole > 0
            && cov.children > 0,
        "{cov:?}"
    );
}

// Every message delivered once.
async fn random_nested_shapes(backend: Backend) {
    nested_shapes(backend, [1, 2], 0.0).await;
}
both_backends!(nested_tests, random_nested_shapes);

// One in five messages delivered twice: the same ledger (effectively once).
async fn random_nested_shapes_delivered_twice(backend: Backend) {
    nested_shapes(backend, [3, 4], 0.2).await;
}
both_backends!(
    nested_duplicates_tests,
    random_nested_shapes_delivered_twice
);

// Grandchildren of steps (0, 1) and (1, 0), or (0, 0) and (1, 1), are two sagas: with
// the step mixed in by XOR, they were one.
#[test]
fn grandchild_ids_are_distinct() {
    let p = SagaId::new();
    assert_ne!(child_id(child_id(p, 0), 1), child_id(child_id(p, 1), 0));
    assert_ne!(child_id(child_id(p, 0), 0), child_id(child_id(p, 1), 1));
}

// The smallest tree the XOR broke: r = [A, B], A = [agent, C], B = [D]; C (r.0.1) and D
// (r.1.0) got one id, so D's start found C (completed), answered A again (late,
// ignored), and B waited for ever: the root never finished. It finishes.
async fn grandchildren_of_crossed_steps_finish(backend: Backend) {
    let leaf = |name: &str| Node {
        name: name.into(),
        steps: vec![Kind::Agent],
    };
    let node = Node {
        name: "r".into(),
        steps: vec![
            Kind::Child(Node {
                name: "a".into(),
                steps: vec![Kind::Agent, Kind::Child(leaf("c"))],
            }),
            Kind::Child(Node {
                name: "b".into(),
                steps: vec![Kind::Child(leaf("d"))],
            }),
        ],
    };
    let mut defs = Vec::new();
    definitions(&node, &mut defs);
    let mut w = World::new(backend, defs, 1).await;
    let root = w.start("r", json!({})).await;
    let pumped = tokio::time::timeout(
        Duration::from_secs(10),
        w.pump(&[root], |_, _, _| Some(ok()), |_, _| ok()),
    )
    .await;
    let r = query::get(&w.store, root).await.unwrap().unwrap();
    assert!(pumped.is_ok(), "the root is {} after 10 s", r.state);
    assert_eq!(r.state, SagaState::Completed);
    let mut model = Model::default();
    model.run(&node, root, None);
    assert_eq!(w.ledger.done, model.done);
}
both_backends!(crossed_tests, grandchildren_of_crossed_steps_finish);
